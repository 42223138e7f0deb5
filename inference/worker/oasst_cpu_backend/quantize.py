"""Making a GGUF file of the type a model config asks for, with llama.cpp's own quantizer, into a cache.

The cache holds one file per source file and target type, named by the source's name, a key of its
resolved path, size and modification time (a changed source is a new key), and the type:
``SmolLM2-135M-Instruct.Q4_1.3f2a...e1.q8_0.gguf``. A file is written under a temporary name and renamed
when complete, so a crash never leaves a half file that a later start would serve; a lock file keeps two
backends that start together (one per GPU group) from making the same file twice.

``llama_model_quantize`` is one blocking C call. Its progress is what llama.cpp logs, one line per tensor
(``[  12/ 272] blk.1.attn_k.weight ...``): the log callback is ours while it runs, and each tensor becomes a
progress line and a count that ``/health`` shows.

Quantizing a file that is already quantized (``allow_requantize``) first expands its weights to floats: a
Q4_1 file made Q8_0 has Q8_0's layout and size but keeps Q4_1's rounding error. The best source is the
most precise file the config names (:func:`~oasst_cpu_backend.model_files.source_files`).
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import os
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import llama_cpp
from loguru import logger

from oasst_cpu_backend.model_files import FLOAT_TYPES, LLAMA_FILE_TYPES, GgufFile, ModelFileError, read_gguf

_TENSOR_LINE = re.compile(r"^\[\s*(\d+)/\s*(\d+)\]\s+(\S+)")
# llama.cpp writes the log from whichever thread runs the call; one quantization at a time has it.
_LOG_LOCK = threading.Lock()


class QuantizeError(RuntimeError):
    pass


@dataclass
class QuantizeProgress:
    """How far the running quantization is; read by ``/health`` from the event loop while it runs."""

    tensors_done: int = 0
    tensors_total: int = 0
    tensor: str | None = None


def cache_path(source: GgufFile, target: str, cache_dir: Path) -> Path:
    stat = source.path.stat()
    key = hashlib.sha256(f"{source.path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[
        :16
    ]
    return cache_dir / f"{source.path.stem}.{key}.{target}.gguf"


def quantized(
    source: GgufFile,
    target: str,
    cache_dir: Path,
    *,
    threads: int,
    progress: QuantizeProgress | None = None,
) -> Path:
    """The file of type ``target`` made from ``source``: ``source`` itself if it has that type, the cached
    file if one was made before, else a new one (blocking: run it in a thread)."""
    if source.file_type == target:
        logger.info("serving {} as it is: it is already {}", source.describe(), target)
        return source.path
    out = cache_path(source, target, cache_dir)
    if _valid(out, target):
        logger.info("using {} from the cache (made from {} earlier)", out, source.path.name)
        return out
    cache_dir.mkdir(parents=True, exist_ok=True)
    with _file_lock(out.with_name(out.name + ".lock")):
        if _valid(out, target):  # another process made it while this one waited for the lock
            logger.info("using {} from the cache (made by another process)", out)
            return out
        _quantize(source, target, out, threads=threads, progress=progress or QuantizeProgress())
    return out


def _quantize(source: GgufFile, target: str, out: Path, *, threads: int, progress: QuantizeProgress) -> None:
    requantize = source.file_type not in FLOAT_TYPES
    if requantize:
        logger.warning(
            "quantizing {} to {}: the source is already quantized, so its weights are expanded and "
            "quantized again; the result keeps {}'s rounding error (a higher-precision source, an F16 or "
            "F32 GGUF file beside it, avoids that)",
            source.describe(),
            target,
            source.file_type or "its",
        )
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = LLAMA_FILE_TYPES[target]
    params.nthread = threads
    params.allow_requantize = requantize
    partial = out.with_name(f"{out.name}.partial-{os.getpid()}")
    logger.info("quantizing {} to {} into {}", source.describe(), target, out)
    started = time.monotonic()
    try:
        with _quantizer_log(progress, target):
            code = llama_cpp.llama_model_quantize(
                str(source.path).encode(), str(partial).encode(), ctypes.byref(params)
            )
        if code != 0:
            raise QuantizeError(
                f"llama.cpp's quantizer failed (code {code}) making {target} of {source.path}"
            )
        if not _valid(partial, target):
            raise QuantizeError(f"the quantizer's output {partial} is not a {target} GGUF file")
        partial.rename(out)
    finally:
        partial.unlink(missing_ok=True)
    logger.info(
        "quantized {} to {} in {:.1f}s: {:.1f} MiB -> {:.1f} MiB ({})",
        source.path.name,
        target,
        time.monotonic() - started,
        source.size / 2**20,
        out.stat().st_size / 2**20,
        out,
    )


def _valid(path: Path, target: str) -> bool:
    if not path.is_file():
        return False
    try:
        return read_gguf(path).file_type == target
    except ModelFileError:
        return False


@contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextmanager
def _quantizer_log(progress: QuantizeProgress, target: str) -> Iterator[None]:
    """llama.cpp's log goes to our progress while the quantizer runs, then back to llama-cpp-python's."""
    pending: list[str] = []  # a tensor's line arrives in pieces: up to its newline

    @llama_cpp.llama_log_callback
    def on_log(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
        pending.append(text.decode("utf-8", errors="replace"))
        if not pending[-1].endswith("\n"):
            return
        line = "".join(pending).strip()
        pending.clear()
        match = _TENSOR_LINE.match(line)
        if match is None:
            logger.debug("llama.cpp: {}", line)
            return
        progress.tensors_done, progress.tensors_total = int(match[1]), int(match[2])
        progress.tensor = match[3]
        logger.info(
            "quantizing to {}: tensor {}/{} {}",
            target,
            progress.tensors_done,
            progress.tensors_total,
            match[3],
        )

    with _LOG_LOCK:
        llama_cpp.llama_log_set(on_log, ctypes.c_void_p(0))
        try:
            yield
        finally:
            _restore_default_log()


def _restore_default_log() -> None:
    # llama-cpp-python's own callback (it prints only when a model is loaded with verbose=True).
    from llama_cpp import _logger

    llama_cpp.llama_log_set(_logger.llama_log_callback, ctypes.c_void_p(0))
