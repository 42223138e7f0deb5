"""Backend processes the worker starts and keeps running: one per GPU group, restarted with backoff.

A worker given GPUs ``["0", "1", "2", "3"]`` and a config of 2 GPUs per replica starts two backends, one
with ``CUDA_VISIBLE_DEVICES=0,1`` and one with ``CUDA_VISIBLE_DEVICES=2,3``, each served by a connection of
its own to the server. When a backend exits while the worker runs, :class:`ManagedBackend` tells its
connection at once (which hands the jobs it held back to the server as retryable failures, and takes no
work until the backend answers its health check again), then starts it again after a delay that doubles
from ``managed_restart_min_delay`` up to ``managed_restart_max_delay`` while it keeps dying (reset once it
has stayed up for a minute).

The children die with the worker (Linux ``PR_SET_PDEATHSIG``): a worker killed hard leaves no backend
holding its GPUs.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import random
import signal
import sys
import time
from collections.abc import Awaitable, Callable

from loguru import logger

from oasst_worker.managed.launch import Launch

# A backend that stayed up this long is healthy again: its next crash restarts it after the minimum delay.
STABLE_SECONDS = 60.0

OnExit = Callable[[str], Awaitable[None]]


class GpuAssignmentError(ValueError):
    pass


def gpu_groups(gpu_ids: list[str], per_replica: int) -> list[list[str]]:
    """The GPU groups of one backend each. No GPUs given (or a model that needs none): one backend, with
    the GPUs of the environment. GPUs that do not fill a group stay unused (logged)."""
    if per_replica == 0 or not gpu_ids:
        return [[]]
    if len(set(gpu_ids)) != len(gpu_ids):
        raise GpuAssignmentError(f"gpu_ids names a GPU twice: {gpu_ids}")
    if len(gpu_ids) < per_replica:
        raise GpuAssignmentError(
            f"the model needs {per_replica} GPUs per replica and this worker was given {len(gpu_ids)}: {gpu_ids}"
        )
    groups = [gpu_ids[i : i + per_replica] for i in range(0, len(gpu_ids) - per_replica + 1, per_replica)]
    unused = gpu_ids[len(groups) * per_replica :]
    if unused:
        logger.warning("GPUs {} fill no group of {}: they stay unused", unused, per_replica)
    return groups


class ManagedBackend:
    """One backend process: started, watched, restarted after it dies, stopped with the worker."""

    def __init__(
        self,
        name: str,
        launch: Launch,
        *,
        on_exit: OnExit,
        min_delay: float,
        max_delay: float,
        stop_timeout: float,
    ) -> None:
        self.name = name
        self.launch = launch
        self._on_exit = on_exit
        self._min_delay = min_delay
        self._max_delay = max_delay
        self._stop_timeout = stop_timeout
        self._process: asyncio.subprocess.Process | None = None
        self._stopping = False
        self._replacing = False  # the process is being stopped to start another launch: not a crash
        self._parked = False  # stopped on purpose (a model unloaded): started again by replace()
        self._resume = asyncio.Event()
        self._started = asyncio.Event()
        self.starts = 0  # how many times it was started (restarts + 1)

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None and self._process.returncode is None else None

    async def wait_started(self) -> None:
        await self._started.wait()

    async def run(self) -> None:
        """Start the backend and restart it whenever it dies, until :meth:`stop`."""
        delay = self._min_delay
        while not self._stopping:
            if self._parked:
                await self._resume.wait()
                delay = self._min_delay
                continue
            started = time.monotonic()
            try:
                process = await self._start()
            except OSError as exc:
                logger.error("backend {} cannot be started: {}", self.name, exc)
                reason = f"the backend cannot be started: {exc}"
            else:
                code = await process.wait()
                if self._stopping:
                    break
                if self._parked:
                    continue
                if self._replacing:
                    self._replacing = False
                    delay = self._min_delay
                    continue
                reason = f"the backend process exited ({_describe(code)})"
                logger.error(
                    "backend {} (pid {}) {}",
                    self.name,
                    process.pid,
                    reason.removeprefix("the backend process "),
                )
            await self._on_exit(reason)
            if time.monotonic() - started > STABLE_SECONDS:
                delay = self._min_delay
            wait = delay * (0.75 + random.random() / 2)
            logger.info("restarting backend {} in {:.1f}s", self.name, wait)
            await asyncio.sleep(wait)
            delay = min(delay * 2, self._max_delay)

    async def replace(self, launch: Launch) -> None:
        """Stop the running backend and start ``launch`` in its place (a model switch), or start it if
        the backend was parked."""
        self.launch = launch
        self._started.clear()
        if self._parked:
            self._parked = False
            self._resume.set()
        else:
            self._replacing = self.pid is not None  # a dead one is started with the new launch anyway
            await self._terminate()
        await self._started.wait()

    async def park(self) -> None:
        """Stop the backend and start nothing until :meth:`replace` (its model unloaded)."""
        self._parked = True
        self._resume.clear()
        await self._terminate()

    async def stop(self) -> None:
        """SIGTERM, then SIGKILL after ``stop_timeout``; the backend is not restarted."""
        self._stopping = True
        await self._terminate()

    async def _terminate(self) -> None:
        process = self._process
        if process is None or process.returncode is not None:
            return
        logger.info("stopping backend {} (pid {})", self.name, process.pid)
        with contextlib.suppress(ProcessLookupError):
            process.terminate()
        try:
            await asyncio.wait_for(process.wait(), self._stop_timeout)
        except asyncio.TimeoutError:
            logger.warning(
                "backend {} did not stop within {:.0f}s: killing it", self.name, self._stop_timeout
            )
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()

    async def _start(self) -> asyncio.subprocess.Process:
        launch = self.launch
        gpus = launch.env.get("CUDA_VISIBLE_DEVICES")
        logger.info(
            "starting backend {}{}: {}", self.name, f" on GPUs {gpus}" if gpus else "", " ".join(launch.argv)
        )
        process = await asyncio.create_subprocess_exec(
            *launch.argv,
            env={**os.environ, **launch.env},
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )
        self._process = process
        self.starts += 1
        self._started.set()
        assert process.stdout is not None
        asyncio.create_task(self._relay_output(process.stdout), name=f"backend-{self.name}-output")
        return process

    async def _relay_output(self, stream: asyncio.StreamReader) -> None:
        # The backend's own log, one line at a time under its name (lines longer than the reader's limit
        # are split rather than lost).
        while True:
            try:
                line = await stream.readline()
            except ValueError:
                line = await stream.read(1 << 16)
            if not line:
                return
            logger.info("[{}] {}", self.name, line.decode("utf-8", errors="replace").rstrip())


def _describe(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def _die_with_parent() -> None:
    # Runs in the child between fork and exec: ask the kernel to SIGTERM it when the worker dies.
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
