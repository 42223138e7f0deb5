"""The model configs an operator keeps in files, merged over the built-ins and checked when a process starts.

A registry directory holds YAML (``.yaml``, ``.yml``) or JSON (``.json``) files, each one config (a mapping)
or a list of them; other files are ignored. A file's config replaces a built-in of the same name; two files
naming the same config are an error. Every problem of every file is reported at once, each naming its file,
its entry where a file holds a list, and its field::

    models/smollm2-q8.yaml: quantization: Input should be 'none', 'f32', ... or 'int4'
    models/fleet.yaml: [2] (name 'qwen'): quantisation: unknown field (did you mean 'quantization'?)

A config may also name the stable ``aliases`` clients may ask for it by, and its ordered ``fallbacks``
(:mod:`oasst_shared.model_routes`); the server routes by them, workers ignore them::

    name: qwen2.5-7b-awq
    aliases: [chat-default]
    fallbacks: [SmolLM2-135M-Instruct]

The server, the worker and the CPU backend each load the registry of their ``model_configs_dir`` setting.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from oasst_shared.model_configs import MODEL_CONFIGS, ModelConfig
from oasst_shared.model_routes import (
    MAX_ALIASES,
    MAX_ALIASES_PER_CONFIG,
    ModelRoute,
    alias_name_problem,
    fallback_problems,
)

BUILT_IN = "built-in"
# Keys of a config's file entry that are the server's routing, not the config's fields.
ROUTE_FIELDS = ("aliases", "fallbacks")
CONFIG_SUFFIXES = (".yaml", ".yml", ".json")
MAX_FILE_BYTES = 1 << 20
MAX_CONFIGS = 1000


class ModelRegistryError(ValueError):
    """The registry's files are not valid: ``problems`` lists each one, naming its file and field."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("invalid model configs:\n  " + "\n  ".join(problems))


@dataclass(frozen=True)
class RegistryEntry:
    config: ModelConfig
    # Where it was read: a file's path as given (relative paths stay relative), or "built-in".
    source: str
    aliases: tuple[str, ...] = ()
    fallbacks: tuple[str, ...] = ()


class ModelRegistry(Mapping[str, ModelConfig]):
    """Model configs by name, each with the file it came from."""

    def __init__(self, entries: Mapping[str, RegistryEntry]) -> None:
        self._entries = dict(entries)

    def __getitem__(self, name: str) -> ModelConfig:
        return self._entries[name].config

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def source(self, name: str) -> str:
        """The file a config came from, or "built-in"."""
        return self._entries[name].source

    def require(self, name: str) -> ModelConfig:
        """The config ``name``; ``KeyError`` names the known ones."""
        try:
            return self[name]
        except KeyError:
            raise KeyError(f"unknown model config {name!r}; known: {sorted(self)}") from None

    @property
    def aliases(self) -> dict[str, ModelRoute]:
        """The aliases the files declare, each routed to its config with the config's fallbacks."""
        return {
            alias: ModelRoute(model=name, fallbacks=list(entry.fallbacks))
            for name, entry in self._entries.items()
            for alias in entry.aliases
        }

    def alias_source(self, alias: str) -> str | None:
        """The file that declares ``alias``, or None."""
        return next((e.source for e in self._entries.values() if alias in e.aliases), None)

    def fallbacks(self, name: str) -> tuple[str, ...]:
        """The fallbacks the files give config ``name``, in order (none for an unknown name)."""
        entry = self._entries.get(name)
        return entry.fallbacks if entry is not None else ()

    def problem(self, name: str, field: str, message: str) -> str:
        """A problem found later (a backend's mapping) worded as the loader words its own."""
        return f"{self.source(name)}: {field}: {message}"


def builtin_registry() -> ModelRegistry:
    return ModelRegistry({name: RegistryEntry(c, BUILT_IN) for name, c in MODEL_CONFIGS.items()})


def load_registry(directory: Path | str | None) -> ModelRegistry:
    """The built-ins with the configs of ``directory`` merged over them (None: the built-ins alone).

    Raises :class:`ModelRegistryError` naming every invalid file, entry and field.
    """
    entries = {name: RegistryEntry(c, BUILT_IN) for name, c in MODEL_CONFIGS.items()}
    if directory is None:
        return ModelRegistry(entries)
    directory = Path(directory)
    if not directory.is_dir():
        raise ModelRegistryError([f"{directory}: not a directory"])
    problems: list[str] = []
    from_files: dict[str, str] = {}
    for path in sorted(directory.iterdir()):
        if path.name.startswith(".") or path.suffix.lower() not in CONFIG_SUFFIXES or not path.is_file():
            continue
        for config, routes in _configs_of(path, problems):
            if config.name in from_files:
                problems.append(f"{path}: name: {config.name!r} is also defined in {from_files[config.name]}")
                continue
            from_files[config.name] = str(path)
            entries[config.name] = RegistryEntry(config, str(path), *routes)
    if len(from_files) > MAX_CONFIGS:
        problems.append(f"{directory}: more than {MAX_CONFIGS} model configs")
    problems.extend(_route_problems(entries))
    if problems:
        raise ModelRegistryError(problems)
    return ModelRegistry(entries)


def _route_problems(entries: Mapping[str, RegistryEntry]) -> list[str]:
    """Aliases that are configs' names or declared twice, fallbacks that are no config (or one of
    another kind), too many aliases."""
    problems: list[str] = []
    declared: dict[str, str] = {}
    for name, entry in entries.items():
        for alias in entry.aliases:
            if alias in entries:
                problems.append(f"{entry.source}: aliases: {alias!r} is the name of a model config")
            elif alias in declared:
                problems.append(f"{entry.source}: aliases: {alias!r} is also an alias of {declared[alias]!r}")
            declared[alias] = name
    all_aliases = {alias for entry in entries.values() for alias in entry.aliases}
    for name, entry in entries.items():
        for fallback in entry.fallbacks:
            other = entries.get(fallback)
            if other is None:
                why = (
                    "an alias; fallbacks name model configs" if fallback in all_aliases else "no model config"
                )
                problems.append(f"{entry.source}: fallbacks: {fallback!r} is {why}")
            elif other.config.kind != entry.config.kind:
                problems.append(
                    f"{entry.source}: fallbacks: {fallback!r} is a {other.config.kind} model; "
                    f"{name!r} is a {entry.config.kind} model"
                )
    if len(declared) > MAX_ALIASES:
        problems.append(f"more than {MAX_ALIASES} aliases")
    return problems


def _routes_of(
    item: dict[str, Any], where: str, problems: list[str]
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The entry's ``aliases`` and ``fallbacks`` (removed from ``item``), each checked on its own."""
    found: list[tuple[str, ...]] = []
    for key, bound in (("aliases", MAX_ALIASES_PER_CONFIG), ("fallbacks", None)):
        value = item.pop(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            problems.append(f"{where}{key}: expected a list of names")
            found.append(())
            continue
        if bound is not None and len(value) > bound:
            problems.append(f"{where}{key}: at most {bound} (got {len(value)})")
        found.append(tuple(value))
    aliases, fallbacks = found
    for alias in aliases:
        why = alias_name_problem(alias)
        if why:
            problems.append(f"{where}aliases: {why}")
    if len(set(aliases)) != len(aliases):
        problems.append(f"{where}aliases: a name is listed twice")
    name = item.get("name")
    problems.extend(f"{where}fallbacks: {p}" for p in fallback_problems(str(name), fallbacks))
    return aliases, fallbacks


def _configs_of(
    path: Path, problems: list[str]
) -> list[tuple[ModelConfig, tuple[tuple[str, ...], tuple[str, ...]]]]:
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            problems.append(f"{path}: larger than {MAX_FILE_BYTES} bytes")
            return []
        text = path.read_text(encoding="utf-8")
        data = json.loads(text) if path.suffix.lower() == ".json" else yaml.safe_load(text)
    except (OSError, UnicodeDecodeError, ValueError, yaml.YAMLError) as exc:
        problems.append(f"{path}: cannot be read: {_read_error(exc)}")
        return []
    if isinstance(data, dict):
        items, listed = [data], False
    elif isinstance(data, list):
        items, listed = data, True
    else:
        problems.append(f"{path}: expected a model config (a mapping) or a list of them")
        return []
    configs = []
    for index, item in enumerate(items):
        where = f"{path}: " + (_entry_label(index, item) if listed else "")
        if not isinstance(item, dict):
            problems.append(f"{where}expected a mapping of fields")
            continue
        unknown = _unknown_fields(item)
        if unknown:
            problems.extend(f"{where}{field}: {why}" for field, why in unknown)
            continue
        item = _relative_to(path, dict(item))
        before = len(problems)
        routes = _routes_of(item, where, problems)
        if len(problems) > before:
            continue
        try:
            configs.append((ModelConfig.model_validate(item), routes))
        except ValidationError as exc:
            for error in exc.errors(include_url=False):
                field = ".".join(str(part) for part in error["loc"])
                message = error["msg"].removeprefix("Value error, ")
                problems.append(f"{where}{field}: {message}" if field else f"{where}{message}")
    return configs


def _entry_label(index: int, item: object) -> str:
    name = item.get("name") if isinstance(item, dict) else None
    return f"[{index}] (name {name!r}): " if isinstance(name, str) else f"[{index}]: "


def _unknown_fields(item: dict[str, Any]) -> list[tuple[str, str]]:
    """A misspelt field would otherwise be dropped in silence and its default would act instead."""
    known = [*ModelConfig.model_fields, *ROUTE_FIELDS]
    unknown = []
    for key in item:
        if key not in known:
            close = difflib.get_close_matches(str(key), known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            unknown.append((str(key), f"unknown field{hint}"))
    return unknown


def _relative_to(path: Path, item: dict[str, Any]) -> dict[str, Any]:
    """A relative ``model_path`` is relative to the file that names it, not to the process's directory."""
    model_path = item.get("model_path")
    if isinstance(model_path, str) and model_path and not Path(model_path).expanduser().is_absolute():
        return {**item, "model_path": str((path.parent / model_path).resolve())}
    if isinstance(model_path, str) and model_path.startswith("~"):
        return {**item, "model_path": str(Path(model_path).expanduser())}
    return item


def _read_error(exc: BaseException) -> str:
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        return f"line {mark.line + 1}, column {mark.column + 1}: {exc.problem}"
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
