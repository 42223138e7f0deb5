"""``/v1/models``: the models connected workers serve now or can load (on-demand loading), with their
context length, quantization and whether they are loaded; and the aliases whose config (or a fallback of
it) is among them, each with the card of the model that would serve it and ``alias_of``. Of those, only
the ones the caller's key and user may use (their allow-lists, ``quotas``)."""

from __future__ import annotations

import time

from sqlmodel.ext.asyncio.session import AsyncSession

from oasst_inference_server.auth.caller import Caller
from oasst_inference_server.db.engine import end_read
from oasst_inference_server.domain_errors import NotFound
from oasst_inference_server.openai_api.openai_service import OpenAIService
from oasst_inference_server.openai_protocol.models import ModelCard, ModelList
from oasst_inference_server.quotas.gate import QuotaGate
from oasst_inference_server.routing.router import Route
from oasst_inference_server.scheduling.worker_registry import LiveModel

_STARTED = int(time.time())


def _card(model: LiveModel, alias: Route | None = None) -> ModelCard:
    return ModelCard(
        id=alias.requested if alias else model.config.name,
        alias_of=alias.target if alias else None,
        created=_STARTED,
        context_length=model.config.max_total_length,
        max_input_length=model.config.max_input_length,
        kind=model.config.kind,
        worker_count=model.worker_count,
        loaded=model.loaded,
        loadable_worker_count=model.loadable_count,
        quantization=model.config.quantization,
    )


class ModelServing:
    def __init__(self, service: OpenAIService, quotas: QuotaGate | None = None) -> None:
        self.service = service
        self.quotas = quotas

    async def _visible(
        self, session: AsyncSession | None, caller: Caller | None, wanted: str | None = None
    ) -> dict[str, LiveModel]:
        live = await self.service.fleet_models(wanted=wanted)
        if self.quotas is None or session is None or caller is None:
            return live
        allowed = await self.quotas.allowed_models(session, caller.user.id, caller.api_key_id)
        await end_read(session)  # not held while the aliases are read (on a session of their own)
        return live if allowed is None else {n: m for n, m in live.items() if n in allowed}

    async def list(self, session: AsyncSession | None = None, caller: Caller | None = None) -> ModelList:
        live = await self._visible(session, caller)
        cards = [_card(m) for _, m in sorted(live.items())]
        for route in await self.service.alias_routes():
            serving = next((live[n] for n in route.candidates if n in live), None)
            if serving is not None and route.requested not in live:
                cards.append(_card(serving, route))
        return ModelList(data=sorted(cards, key=lambda c: c.id))

    async def retrieve(
        self, name: str, session: AsyncSession | None = None, caller: Caller | None = None
    ) -> ModelCard:
        """The model or alias ``name``: NotFound (naming the available ones) unless a worker serves it (or,
        for an alias, its config or a fallback) now or can load it, and the caller may use it."""
        live = await self._visible(session, caller, wanted=name)
        if name in live:
            return _card(live[name])
        route = next((r for r in await self.service.alias_routes() if r.requested == name), None)
        serving = next((live[n] for n in route.candidates if n in live), None) if route else None
        if route is None or serving is None:
            available = ", ".join(sorted(live)) or "none"
            raise NotFound("model_not_found", f"the model {name!r} does not exist; available: {available}")
        return _card(serving, route)
