"""A worker's managed backends and their connections: one backend per GPU group, one connection each.

Each backend is a :class:`ManagedBackend` on a port of its own; each connection is a
:class:`WorkerClient` whose adapter speaks to that port, so the server sees as many workers as there are
GPU groups, each with the free slots of its own backend.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable

from loguru import logger

from oasst_shared.model_configs import ModelConfig
from oasst_worker.connection.client import WorkerClient
from oasst_worker.connection.switching import Switching
from oasst_worker.jobs.base import JobFactory
from oasst_worker.managed.launch import launch_for
from oasst_worker.managed.model_manager import BackendTarget
from oasst_worker.managed.supervisor import ManagedBackend, gpu_groups
from oasst_worker.settings import WorkerSettings

# The jobs of a connection, given its settings (its backend_url) and the model config.
JobFactoryMaker = Callable[[WorkerSettings, ModelConfig], JobFactory]


class ManagedFleet:
    def __init__(
        self,
        settings: WorkerSettings,
        config: ModelConfig,
        job_factory: JobFactoryMaker,
        *,
        switching: Callable[[BackendTarget], Switching | None] | None = None,
    ) -> None:
        groups = gpu_groups(settings.gpu_ids, config.gpus_per_replica)
        ports = _ports(settings.managed_backend_port, len(groups))
        self.backends: list[ManagedBackend] = []
        self.clients: list[WorkerClient] = []
        for index, (gpus, port) in enumerate(zip(groups, ports, strict=True)):
            name = f"{settings.managed_backend}-{'gpu' + '+'.join(gpus) if gpus else index}"
            client_settings = settings.model_copy(
                update={"backend_url": f"http://{_connect_host(settings.managed_backend_host)}:{port}"}
            )
            client = WorkerClient(client_settings, job_factory(client_settings, config), name=name)
            backend = ManagedBackend(
                name,
                launch_for(settings, config, port=port, gpus=gpus),
                on_exit=client.backend_lost,
                min_delay=settings.managed_restart_min_delay,
                max_delay=settings.managed_restart_max_delay,
                stop_timeout=settings.managed_stop_timeout,
            )
            if switching is not None:  # each connection switches its own backend
                client.switching = switching(BackendTarget(client_settings.backend_url, backend))
            self.backends.append(backend)
            self.clients.append(client)
        logger.info(
            "{} managed {} backend(s) for {}: {}",
            len(self.backends),
            settings.managed_backend,
            config.name,
            ", ".join(b.name for b in self.backends),
        )

    async def run(self) -> None:
        """Run the backends and serve each through its connection until every connection has stopped."""
        supervising = [asyncio.create_task(b.run(), name=f"backend-{b.name}") for b in self.backends]
        try:
            await asyncio.gather(*(client.run() for client in self.clients))
        finally:
            await asyncio.gather(*(b.stop() for b in self.backends), return_exceptions=True)
            for task in supervising:
                task.cancel()
            await asyncio.gather(*supervising, return_exceptions=True)
            await asyncio.gather(*(c.factory.backend.close() for c in self.clients), return_exceptions=True)

    def targets(self) -> list[BackendTarget]:
        return [
            BackendTarget(client.settings.backend_url, backend)
            for client, backend in zip(self.clients, self.backends, strict=True)
        ]

    async def drain(self) -> None:
        await asyncio.gather(*(client.drain() for client in self.clients))


def _ports(first: int, count: int) -> list[int]:
    if first:
        return [first + i for i in range(count)]
    ports = []
    for _ in range(count):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            ports.append(probe.getsockname()[1])
    return ports


def _connect_host(host: str) -> str:
    # A backend listening on every address is reached on the loopback one.
    return "127.0.0.1" if host in ("0.0.0.0", "") else ("[::1]" if host == "::" else host)
