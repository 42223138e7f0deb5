"""Opening a connection to the server: the URL and headers, the worker's first frame, and the refusals
that reconnecting cannot mend."""

from __future__ import annotations

import os

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import InvalidStatus, InvalidURI

from oasst_shared.model_configs import ModelConfig
from oasst_shared.protocol import (
    API_KEY_HEADER,
    CLOSE_KEY_FORBIDS,
    CLOSE_UNSUPPORTED_PROTOCOL,
    MAX_FRAME_BYTES,
    MAX_SERVABLE_MODELS,
    PROTOCOL_VERSION,
    PROTOCOL_VERSION_HEADER,
    Hardware,
    ServableModel,
    WorkerInfo,
    dump_frame,
    fits_in_frame,
)
from oasst_worker.backends.factory import backend_capabilities
from oasst_worker.backends.records import BackendInfo
from oasst_worker.connection.errors import FatalWorkerError
from oasst_worker.settings import WorkerSettings
from oasst_worker.tokenizing import PromptTokenizer

WORKER_VERSION = "0.1.0"


def work_url(settings: WorkerSettings) -> str:
    return settings.server_url.rstrip("/") + "/workers/work"


async def open_connection(settings: WorkerSettings) -> ClientConnection:
    url = work_url(settings)
    headers = {API_KEY_HEADER: settings.api_key, PROTOCOL_VERSION_HEADER: str(PROTOCOL_VERSION)}
    try:
        return await connect(
            url,
            additional_headers=headers,
            ping_interval=None,  # the protocol has its own pings
            open_timeout=10,
            compression=None,  # frames are tiny: deflate costs CPU per token and saves nothing
            max_size=MAX_FRAME_BYTES,  # the limit the server keeps too
        )
    except InvalidStatus as exc:
        if exc.response.status_code in (401, 403):
            raise FatalWorkerError(
                f"the server refused the worker API key (HTTP {exc.response.status_code})"
            ) from None
        raise
    except InvalidURI as exc:
        raise FatalWorkerError(f"invalid server URL {url!r}: {exc}") from None


def worker_info(
    settings: WorkerSettings,
    model_config: ModelConfig,
    backend: BackendInfo | None = None,
    tokenizer: PromptTokenizer | None = None,
    *,
    servable: list[ServableModel] | None = None,
    loaded: bool = True,
) -> WorkerInfo:
    """The first frame on every connection (and the last of a model switch): what this worker serves and
    how much at once, what its backend said about its model and build, whether it counts prompts for the
    server (``tokenizer``, unless the settings say not to), and (protocol 6) what it can switch to and
    whether its backend holds the model. Servable configs that would not fit in one frame are left out,
    the served one last."""
    backend = backend or BackendInfo()
    capabilities = backend_capabilities(settings)
    if tokenizer is not None and settings.answer_tokenize:
        capabilities.tokenize = True
        capabilities.prompt_overhead_bytes = tokenizer.prompt_overhead()
    info = WorkerInfo(
        model_config=model_config,
        max_parallel_requests=settings.max_parallel_requests,
        backend_kind=settings.backend_kind,
        worker_version=WORKER_VERSION,
        hardware=Hardware(cpu_count=os.cpu_count()),
        capabilities=capabilities,
        backend_model_id=_bounded(backend.model_id),
        backend_model_revision=_bounded(backend.model_revision),
        backend_version=_bounded(backend.backend_version),
        servable=_servable_first(servable or [], model_config.name)[:MAX_SERVABLE_MODELS],
        loaded=loaded,
    )
    while info.servable and not fits_in_frame(dump_frame(info)):
        info.servable = info.servable[:-1]
    return info


def _servable_first(servable: list[ServableModel], name: str) -> list[ServableModel]:
    """The served config first: it is the last to be left out when the list is cut."""
    return sorted(servable, key=lambda s: s.config.name != name)


def _bounded(value: str | None) -> str | None:
    return value[:256] if value else None


def raise_if_refused(ws: ClientConnection) -> None:
    """After the connection closed: a server that does not speak our protocol version, or an API key
    that does not allow what this worker announced, is fatal (reconnecting would be refused again)."""
    if ws.close_code == CLOSE_UNSUPPORTED_PROTOCOL:
        raise FatalWorkerError(f"the server refused protocol version {PROTOCOL_VERSION}: {ws.close_reason}")
    if ws.close_code == CLOSE_KEY_FORBIDS:
        raise FatalWorkerError(
            f"the server refused this worker: its API key does not allow it: {ws.close_reason} "
            "(ask the server's admin to change the key's limits, or change the worker's settings)"
        )
