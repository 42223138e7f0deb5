"""Setting, removing and listing aliases, for the admin API and the CLI: each change checked, stored,
then announced to every replica (``alias_table``).

Checks, each a clear error: the alias's name (``invalid_alias_name``), that it is no model config's name
(``alias_is_model``), that it names a config and not another alias (``alias_chain``; ``model_not_found``,
a 404),
its fallbacks (``invalid_fallbacks``: configs of the same kind, none twice, not the target, at most
``MAX_FALLBACKS``), and the number of aliases (``too_many_aliases``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

from sqlalchemy.ext.asyncio import async_sessionmaker
from sqlmodel.ext.asyncio.session import AsyncSession

from oasst_inference_server.broker import Broker
from oasst_inference_server.db.models import DbModelAlias
from oasst_inference_server.domain_errors import Conflict, InvalidRequest, NotFound
from oasst_inference_server.routing.alias_store import remove_alias, store_alias, stored_aliases
from oasst_inference_server.routing.alias_table import API, AliasEntry, announce_change
from oasst_shared.model_configs import ModelConfig
from oasst_shared.model_registry import ModelRegistry
from oasst_shared.model_routes import (
    MAX_ALIASES,
    AliasList,
    AliasRead,
    ModelRoute,
    alias_name_problem,
    route_problems,
)

# The configs workers announce now, beyond the server's files (a worker may serve a config the server's
# files do not hold): by name.
FleetConfigs = Callable[[], Awaitable[Mapping[str, ModelConfig]]]


def _refusal(problems: list[str]) -> InvalidRequest | NotFound:
    """The error of the first problem ``route_problems`` found (all of them in its detail)."""
    detail, first = "; ".join(problems), problems[0]
    if first.startswith("model:") and "is an alias" in first:
        return InvalidRequest("alias_chain", detail, param="model")
    if first.startswith("model:"):
        return NotFound("model_not_found", detail, param="model")
    return InvalidRequest("invalid_fallbacks", detail, param="fallbacks")


def file_alias_entries(configs: ModelRegistry) -> dict[str, AliasEntry]:
    return {
        alias: AliasEntry(route, configs.alias_source(alias) or "")
        for alias, route in configs.aliases.items()
    }


class AliasAdmin:
    def __init__(
        self,
        session_factory: async_sessionmaker[AsyncSession],
        broker: Broker,
        configs: ModelRegistry,
        fleet: FleetConfigs | None = None,
    ) -> None:
        self._sessions = session_factory
        self._broker = broker
        self._configs = configs
        self._fleet = fleet
        self._file_aliases = file_alias_entries(configs)

    async def list(self) -> AliasList:
        async with self._sessions() as session:
            rows = {row.alias: row for row in await stored_aliases(session)}
        listed = [self._read_stored(row) for row in rows.values()]
        listed += [
            AliasRead(alias=alias, model=e.route.model, fallbacks=e.route.fallbacks, source=e.source)
            for alias, e in self._file_aliases.items()
            if alias not in rows
        ]
        fallbacks = {name: list(self._configs.fallbacks(name)) for name in self._configs}
        return AliasList(
            aliases=sorted(listed, key=lambda a: a.alias),
            fallbacks={name: names for name, names in sorted(fallbacks.items()) if names},
        )

    async def set(self, alias: str, route: ModelRoute) -> AliasRead:
        """Point ``alias`` at ``route`` (created or replaced), on every replica at once."""
        why = alias_name_problem(alias)
        if why:
            raise InvalidRequest("invalid_alias_name", why, param="alias")
        configs = await self._known_configs()
        if alias in configs:
            raise Conflict("alias_is_model", f"{alias!r} is the name of a model config: choose another alias")
        async with self._sessions() as session:
            stored = {row.alias for row in await stored_aliases(session)}
            aliases = (stored | set(self._file_aliases)) - {alias}
            problems = route_problems(
                route, configs, aliases, kinds={name: c.kind for name, c in configs.items()}
            )
            if problems:
                raise _refusal(problems)
            if alias not in stored and len(stored) >= MAX_ALIASES:
                raise Conflict("too_many_aliases", f"this server keeps at most {MAX_ALIASES} aliases")
            row = await store_alias(session, alias, route)
        await announce_change(self._broker, alias)
        return self._read_stored(row)

    async def delete(self, alias: str) -> None:
        """Remove the stored ``alias`` on every replica (an alias of the same name in a file then acts
        again); ``NotFound`` if none is stored, ``Conflict`` if only a file declares it."""
        async with self._sessions() as session:
            removed = await remove_alias(session, alias)
        if not removed:
            source = self._configs.alias_source(alias)
            if source is not None:
                raise Conflict("alias_in_file", f"the alias {alias!r} is declared in {source}: edit the file")
            raise NotFound("alias_not_found", f"no alias {alias!r}")
        await announce_change(self._broker, alias)

    async def _known_configs(self) -> dict[str, ModelConfig]:
        configs = dict(self._configs)
        if self._fleet is not None:
            for name, config in (await self._fleet()).items():
                configs.setdefault(name, config)
        return configs

    def _read_stored(self, row: DbModelAlias) -> AliasRead:
        file_alias = self._file_aliases.get(row.alias)
        return AliasRead(
            alias=row.alias,
            model=row.model_config_name,
            fallbacks=list(row.fallbacks or []),
            source=API,
            replaces_file=file_alias.source if file_alias else None,
            updated_at=row.updated_at,
        )
