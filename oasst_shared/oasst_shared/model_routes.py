"""Model aliases and fallbacks: the names clients keep, and where a request goes when its model cannot
serve it.

An *alias* is a stable name that stands for one model config (``chat-default`` -> ``qwen2.5-7b``); the
operator moves it to another config without clients changing. An alias names a config, never another
alias (no chains). A *fallback list* is the ordered configs that serve a request when the model asked for
has no worker that can serve it, or its queue is over a bound; it is followed one level only (the
fallbacks' own fallbacks are not), so it cannot loop. Aliases come from the model-config files (a
config's ``aliases``) and from the admin API (kept in the database); a config's ``fallbacks`` come from
its file, and an alias set through the API may carry its own.

This module holds the names' rules, shared by the registry loader, the server and its CLI.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

MAX_ALIAS_LENGTH = 64
MAX_FALLBACKS = 8
MAX_ALIASES = 1000
MAX_ALIASES_PER_CONFIG = 16
# A model config's name may hold "/" (a Hugging Face id); an alias may not: it is a path segment of the
# admin API.
ALIAS_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:@+-]*$"
_ALIAS = re.compile(ALIAS_PATTERN)


class ModelRoute(BaseModel):
    """Where a name goes: a model config, then its fallbacks in order."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    model: str = Field(min_length=1, max_length=128, description="The model config the name stands for.")
    fallbacks: list[str] = Field(
        default_factory=list,
        max_length=MAX_FALLBACKS,
        description="Model configs that serve, in order, when `model` has no worker or its queue is over "
        "the bound.",
    )


def alias_name_problem(name: str) -> str | None:
    """Why ``name`` cannot be an alias, or None."""
    if not name or len(name) > MAX_ALIAS_LENGTH:
        return f"an alias has 1 to {MAX_ALIAS_LENGTH} characters (got {len(name)})"
    if not _ALIAS.fullmatch(name):
        return f"an alias is letters, digits and _ . : @ + -, starting with a letter or digit (got {name!r})"
    return None


def fallback_problems(model: str, fallbacks: Collection[str]) -> list[str]:
    """What is wrong with ``fallbacks`` as ``model``'s list on its own: its length, repeats, ``model``
    itself among them."""
    problems = []
    if len(fallbacks) > MAX_FALLBACKS:
        problems.append(f"at most {MAX_FALLBACKS} fallbacks (got {len(fallbacks)})")
    seen: set[str] = set()
    for name in fallbacks:
        if name == model:
            problems.append(f"{name!r} cannot be its own fallback")
        elif name in seen:
            problems.append(f"{name!r} is listed twice")
        seen.add(name)
    return problems


def route_problems(
    route: ModelRoute, configs: Mapping[str, object], aliases: Collection[str], *, kinds: Mapping[str, str]
) -> list[str]:
    """What is wrong with ``route`` given the known ``configs`` (by name) and ``aliases``: a target that
    is an alias (a chain) or no config, fallbacks that are not configs of the target's kind."""
    problems = []
    if route.model in aliases:
        problems.append(
            f"model: {route.model!r} is an alias; an alias names a model config, not another alias"
        )
    elif route.model not in configs:
        problems.append(f"model: unknown model config {route.model!r}")
    problems.extend(f"fallbacks: {p}" for p in fallback_problems(route.model, route.fallbacks))
    for name in route.fallbacks:
        if name in aliases:
            problems.append(f"fallbacks: {name!r} is an alias; fallbacks name model configs")
        elif name not in configs:
            problems.append(f"fallbacks: unknown model config {name!r}")
        elif route.model in kinds and kinds.get(name) != kinds[route.model]:
            problems.append(
                f"fallbacks: {name!r} is a {kinds.get(name)} model; {route.model!r} is a {kinds[route.model]} model"
            )
    return problems


class AliasRead(BaseModel):
    """An alias as the admin API and CLI list it."""

    alias: str
    model: str = Field(description="The model config the alias stands for.")
    fallbacks: list[str] = Field(description="The configs that serve, in order, when `model` cannot.")
    source: str = Field(description="`api` (set through the admin API or CLI) or the file that declares it.")
    replaces_file: str | None = Field(
        None,
        description="For an alias set through the API: the file whose alias of the same name it replaces.",
    )
    updated_at: datetime | None = Field(None, description="When it was set (API aliases).")


class AliasList(BaseModel):
    aliases: list[AliasRead]
    fallbacks: dict[str, list[str]] = Field(
        default_factory=dict,
        description="The fallbacks the model-config files give each config that has some.",
    )
