"""GGUF files as the CPU backend sees them before it loads one: their type, their trained context, and which
of several is the best source for a quantization.

Only the header's key-value section is read, skipping its arrays (the vocabulary): a few milliseconds
where a full reader (the ``gguf`` package parses every token string) takes seconds per file.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from oasst_shared.model_configs import GGUF_TYPES

# Best first: the order in which files are preferred as the source of a quantization (more bits per
# weight, and k-quants over the legacy types of about the same size): the config's own order of them.
PRECISION_ORDER: tuple[str, ...] = GGUF_TYPES
FLOAT_TYPES = frozenset({"f32", "f16", "bf16"})
# llama.cpp's file types (enum llama_ftype, the header's general.file_type) by our names.
LLAMA_FILE_TYPES: dict[str, int] = {
    "f32": 0,
    "f16": 1,
    "q4_0": 2,
    "q4_1": 3,
    "q8_0": 7,
    "q5_0": 8,
    "q5_1": 9,
    "q2_k": 10,
    "q3_k_s": 11,
    "q3_k_m": 12,
    "q3_k_l": 13,
    "q4_k_s": 14,
    "q4_k_m": 15,
    "q5_k_s": 16,
    "q5_k_m": 17,
    "q6_k": 18,
    "bf16": 32,
}
_TYPE_NAMES = {number: name for name, number in LLAMA_FILE_TYPES.items()}
_MAGIC = b"GGUF"
# GGUF value types: fixed-size scalars by struct format, then string (8) and array (9).
_SCALARS = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_STRING, _ARRAY = 8, 9
_MAX_KEYS = 100_000
_MAX_STRING = 64 << 20


class ModelFileError(RuntimeError):
    """No usable GGUF file where the config or the settings point."""


@dataclass(frozen=True)
class GgufFile:
    path: Path
    size: int
    # Our name of its type (``q4_1``); None when the header does not say or names a type configs cannot.
    file_type: str | None
    context_length: int | None
    architecture: str | None

    @property
    def rank(self) -> int:
        """Lower is more precise; an unknown type ranks last."""
        return PRECISION_ORDER.index(self.file_type) if self.file_type else len(PRECISION_ORDER)

    def describe(self) -> str:
        return f"{self.path.name} ({self.file_type or 'unknown type'}, {self.size / 2**20:.1f} MiB)"


def read_gguf(path: Path) -> GgufFile:
    try:
        with path.open("rb") as file:
            header = _read_header(file)
    except (OSError, ValueError, struct.error, UnicodeDecodeError) as exc:
        raise ModelFileError(f"{path}: not a readable GGUF file: {exc}") from None
    architecture = header.get("general.architecture")
    architecture = architecture if isinstance(architecture, str) else None
    context = header.get(f"{architecture}.context_length") if architecture else None
    file_type = header.get("general.file_type")
    return GgufFile(
        path,
        path.stat().st_size,
        _TYPE_NAMES.get(file_type) if isinstance(file_type, int) else None,
        context if isinstance(context, int) and context > 0 else None,
        architecture,
    )


def source_files(model_path: Path) -> list[GgufFile]:
    """The GGUF files at ``model_path`` (a file, or a folder of them), best source first."""
    if model_path.is_dir():
        paths = sorted(p for p in model_path.glob("*.gguf") if p.is_file())
        if not paths:
            raise ModelFileError(f"no .gguf file in {model_path}")
    elif model_path.is_file():
        paths = [model_path]
    else:
        raise ModelFileError(f"model file not found: {model_path}")
    files = [read_gguf(path) for path in paths]
    return sorted(files, key=lambda f: (f.rank, f.path.name))


def _read_header(file: BinaryIO) -> dict[str, object]:
    """The header's scalar and string values by key (arrays are skipped)."""
    if file.read(4) != _MAGIC:
        raise ValueError("no GGUF magic")
    version, _tensors, keys = struct.unpack("<IQQ", _exactly(file, 20))
    if version < 2:
        raise ValueError(f"GGUF version {version} is too old")
    if keys > _MAX_KEYS:
        raise ValueError(f"{keys} metadata keys")
    values: dict[str, object] = {}
    for _ in range(keys):
        key = _string(file)
        (value_type,) = struct.unpack("<I", _exactly(file, 4))
        if value_type == _ARRAY:
            _skip_array(file)
        else:
            values[key] = _value(file, value_type)
    return values


def _value(file: BinaryIO, value_type: int) -> object:
    if value_type == _STRING:
        return _string(file)
    fmt = _SCALARS.get(value_type)
    if fmt is None:
        raise ValueError(f"unknown value type {value_type}")
    return struct.unpack(fmt, _exactly(file, struct.calcsize(fmt)))[0]


def _skip_array(file: BinaryIO) -> None:
    item_type, count = struct.unpack("<IQ", _exactly(file, 12))
    if item_type == _STRING:
        for _ in range(count):
            (length,) = struct.unpack("<Q", _exactly(file, 8))
            file.seek(length, 1)
    elif item_type in _SCALARS:
        file.seek(count * struct.calcsize(_SCALARS[item_type]), 1)
    else:
        raise ValueError(f"array of value type {item_type}")


def _string(file: BinaryIO) -> str:
    (length,) = struct.unpack("<Q", _exactly(file, 8))
    if length > _MAX_STRING:
        raise ValueError(f"a string of {length} bytes")
    return _exactly(file, length).decode("utf-8")


def _exactly(file: BinaryIO, count: int) -> bytes:
    data = file.read(count)
    if len(data) != count:
        raise ValueError("the file ends inside its header")
    return data
