"""``oasst-worker``: serve one backend to the inference server."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Callable

from loguru import logger
from prometheus_client import start_http_server

from oasst_shared.model_configs import ModelConfig
from oasst_shared.model_files import hf_folder_of, read_hf_folder, with_model_facts
from oasst_shared.model_registry import ModelRegistry
from oasst_worker.backends.factory import create_embedding_backend, create_generation_backend
from oasst_worker.connection.client import WorkerClient
from oasst_worker.connection.errors import FatalWorkerError
from oasst_worker.connection.switching import Switching
from oasst_worker.event_loop import run
from oasst_worker.jobs.base import JobFactory
from oasst_worker.jobs.embedding import EmbeddingJobFactory
from oasst_worker.jobs.generation import GenerationJobFactory
from oasst_worker.managed.fleet import ManagedFleet
from oasst_worker.managed.launch import LaunchError, launch
from oasst_worker.managed.model_manager import BackendTarget, model_switching
from oasst_worker.settings import WorkerSettings


def job_factory(settings: WorkerSettings, model_config: ModelConfig) -> JobFactory:
    """The jobs of the worker's kind, on the backend the settings choose."""
    if settings.backend_kind == "embedding":
        return EmbeddingJobFactory(create_embedding_backend(settings), model_config)
    return GenerationJobFactory(create_generation_backend(settings, model_config), model_config)


def model_config(settings: WorkerSettings, registry: ModelRegistry) -> ModelConfig:
    """The config this worker serves, completed from its model folder where it has one (TGI, vLLM)."""
    config = settings.resolve_model_config(registry)
    folder = hf_folder_of(config)
    if folder is not None:
        config = with_model_facts(config, read_hf_folder(folder))
    if settings.managed_backend != "none":
        try:  # refused now, naming the file and field, rather than by the backend's launcher later
            launch(config, kind=settings.managed_backend, host="127.0.0.1", port=1, gpus=[])
        except LaunchError as exc:
            source = registry.source(config.name) if config.name in registry else "model config"
            raise ValueError(f"{source}: {exc.field}: {exc}") from None
    return config


def switching_for(
    operator: WorkerSettings, registry: ModelRegistry, config: ModelConfig
) -> Callable[[BackendTarget], Switching | None]:
    """Each connection's switching of its own backend (protocol 6), from the settings as the operator
    gave them (parallel requests follow each config from them)."""
    return lambda target: model_switching(operator, registry, config, target, job_factory)


def build_clients(
    operator: WorkerSettings, registry: ModelRegistry, config: ModelConfig
) -> tuple[list[WorkerClient], ManagedFleet | None]:
    """The worker's connections: one to the operator's backend, or one per backend it starts."""
    settings = operator.model_copy(update={"max_parallel_requests": operator.parallel_requests(config)})
    switching = switching_for(operator, registry, config)
    if settings.managed_backend == "none":
        target = BackendTarget(settings.backend_url)
        client = WorkerClient(settings, job_factory(settings, config), switching=switching(target))
        return [client], None
    fleet = ManagedFleet(settings, config, job_factory, switching=switching)
    return fleet.clients, fleet


async def _main(settings: WorkerSettings) -> int:
    try:
        registry = settings.registry()
        config = model_config(settings, registry)
    except (ValueError, KeyError) as exc:  # ModelRegistryError is a ValueError
        logger.error("cannot start: {}", exc)
        return 2
    clients, fleet = build_clients(settings, registry, config)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda: [asyncio.ensure_future(c.drain()) for c in clients])
    try:
        if fleet is not None:
            await fleet.run()
        else:
            await clients[0].run()
    except FatalWorkerError as exc:
        logger.error("{}", exc)
        return 2
    finally:
        if fleet is None:
            await clients[0].factory.backend.close()
    logger.info("worker stopped")
    return 0


def main() -> None:
    settings = WorkerSettings()
    logger.remove()
    logger.add(sys.stderr, level=settings.log_level.upper(), backtrace=False, diagnose=False)
    if settings.metrics_port:
        start_http_server(
            settings.metrics_port,
            addr=settings.metrics_host,
        )
        logger.info("metrics on :{}/metrics", settings.metrics_port)
    sys.exit(run(_main(settings), settings.event_loop))


if __name__ == "__main__":
    main()
