"""Which model config serves a request for a name: an alias's config or the name itself, else the first
of its fallbacks that can serve.

A name is looked up among the aliases first (one level: an alias names a config), then taken as a config.
Its candidates are the config, then the alias's fallbacks (an alias set without any takes its config's
from the model-config files). A candidate serves if some worker has it loaded or can load it, and, when
a later candidate exists, its queue is under ``fallback_queue_length`` (default ``max_queue_size``).
When none can, the first that has a worker at all is chosen (its queue bound then answers), else none:
the caller says the requested model has no worker. Only availability moves a request: whatever is wrong
with the request itself (a model of the wrong kind, parameters its workers refuse) is the caller's
error, raised by the caller for the chosen model, never retried on a fallback.
"""

from __future__ import annotations

from dataclasses import dataclass

from loguru import logger

from oasst_inference_server.broker import Broker, BrokerError
from oasst_inference_server.events import work_queue_name
from oasst_inference_server.routing.alias_table import AliasEntry, AliasTable
from oasst_inference_server.scheduling.worker_registry import LiveModel, WorkerRegistry
from oasst_shared.model_registry import ModelRegistry


@dataclass(frozen=True)
class Route:
    requested: str
    # The config the name stands for (the name itself when it is no alias).
    target: str
    fallbacks: tuple[str, ...] = ()
    alias: bool = False

    @property
    def candidates(self) -> tuple[str, ...]:
        return (self.target, *self.fallbacks)

    def named(self, name: str) -> str:
        """``name`` (a candidate) as error messages show it: with the alias the client asked for."""
        return f"{name!r} (alias {self.requested!r})" if self.alias and name == self.target else repr(name)


@dataclass(frozen=True)
class Picked:
    route: Route
    # The model that serves; None when no candidate has a worker that serves it or can load it.
    model: LiveModel | None

    @property
    def fell_back(self) -> bool:
        return self.model is not None and self.model.config.name != self.route.target


class ModelRouter:
    def __init__(
        self,
        registry: WorkerRegistry,
        aliases: AliasTable | None,
        broker: Broker,
        configs: ModelRegistry,
        queue_bound: int,
    ) -> None:
        self.registry = registry
        self.aliases = aliases
        self._broker = broker
        self._configs = configs  # the model-config files: each config's kind and fallbacks
        self._queue_bound = queue_bound

    async def route(self, name: str) -> Route:
        entry = (await self.aliases.current()).get(name) if self.aliases is not None else None
        if entry is None:
            return Route(name, name, self._configs.fallbacks(name))
        return self._alias_route(name, entry)

    async def alias_routes(self) -> list[Route]:
        """Every alias, routed, by name."""
        aliases = await self.aliases.current() if self.aliases is not None else {}
        return [self._alias_route(name, entry) for name, entry in sorted(aliases.items())]

    def _alias_route(self, name: str, entry: AliasEntry) -> Route:
        fallbacks = tuple(entry.route.fallbacks) or self._configs.fallbacks(entry.route.model)
        return Route(name, entry.route.model, fallbacks, alias=True)

    async def pick(self, name: str, *, loaded_only: bool = False) -> Picked:
        """The model that serves a request for ``name`` now (``loaded_only``: among loaded models only,
        for a question that cannot wait for a load). When no candidate serves: the first that has a
        worker at all (the caller then refuses it for what it lacks), else None."""
        route = await self.route(name)
        candidates = route.candidates
        first: LiveModel | None = None
        known = self._configs.get(route.target)
        kind = known.kind if known is not None else None
        for index, candidate in enumerate(candidates):
            model = await self.registry.model(candidate)
            if index == 0 and model is not None:
                kind = model.config.kind
            if model is None or (kind is not None and model.config.kind != kind):
                continue  # a fallback of another kind never serves (the files and the API refuse it too)
            if first is None:
                first = model  # what the caller's errors speak of, when no candidate serves
            if loaded_only and not model.loaded:
                continue
            if index < len(candidates) - 1 and await self._queue_full(candidate):
                continue
            if index > 0:
                logger.info("model {} cannot serve now: {} falls back to {}", route.target, name, candidate)
            return Picked(route, model)
        if first is None and len(candidates) > 1:
            logger.info("no worker serves {} or any of its fallbacks", name)
        return Picked(route, first)

    async def _queue_full(self, name: str) -> bool:
        try:
            return await self._broker.queue_length(work_queue_name(name)) >= self._queue_bound
        except BrokerError:
            return False  # unknown: the model's own admission counts its queue
