"""Aliases and fallbacks in the model-config files: read with the configs, each problem named with its
file and field; the names' bounds."""

from __future__ import annotations

from pathlib import Path

import pytest

from oasst_shared.model_configs import MINILM_EMBEDDING, SMOLLM2_135M, SMOLLM2_135M_Q8
from oasst_shared.model_registry import ModelRegistryError, load_registry
from oasst_shared.model_routes import MAX_ALIAS_LENGTH, MAX_FALLBACKS, ModelRoute, alias_name_problem


def registry_of(tmp_path: Path, text: str):
    (tmp_path / "models.yaml").write_text(text, encoding="utf-8")
    return load_registry(tmp_path)


def test_a_config_declares_its_aliases_and_fallbacks(tmp_path: Path) -> None:
    registry = registry_of(
        tmp_path,
        f"name: big\nmodel_id: org/big\naliases: [chat-default, chat:latest]\n"
        f"fallbacks: [{SMOLLM2_135M_Q8.name}, {SMOLLM2_135M.name}]\n",
    )
    assert registry.fallbacks("big") == (SMOLLM2_135M_Q8.name, SMOLLM2_135M.name)
    route = ModelRoute(model="big", fallbacks=[SMOLLM2_135M_Q8.name, SMOLLM2_135M.name])
    assert registry.aliases == {"chat-default": route, "chat:latest": route}
    assert registry.alias_source("chat-default") == str(tmp_path / "models.yaml")
    assert registry.fallbacks(SMOLLM2_135M.name) == () and registry.alias_source("nope") is None
    assert "aliases" not in registry["big"].model_fields_set  # routing is not part of the config


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("name: m\nmodel_id: m\naliases: [bad name]\n", "aliases: an alias is letters, digits"),
        (f"name: m\nmodel_id: m\naliases: [{SMOLLM2_135M.name}]\n", "is the name of a model config"),
        ("name: m\nmodel_id: m\naliases: [a, a]\n", "aliases: a name is listed twice"),
        ("name: m\nmodel_id: m\naliases: a\n", "aliases: expected a list of names"),
        ("name: m\nmodel_id: m\nfallbacks: [m]\n", "fallbacks: 'm' cannot be its own fallback"),
        ("name: m\nmodel_id: m\nfallbacks: [nowhere]\n", "fallbacks: 'nowhere' is no model config"),
        (f"name: m\nmodel_id: m\nfallbacks: [{MINILM_EMBEDDING.name}]\n", "is a embedding model"),
        (
            "- {name: m, model_id: m, aliases: [x]}\n- {name: n, model_id: n, fallbacks: [x]}\n",
            "'x' is an alias",
        ),
        ("- {name: m, model_id: m, aliases: [x]}\n- {name: n, model_id: n, aliases: [x]}\n", "also an alias"),
        (
            "name: m\nmodel_id: m\nfallbacks: ["
            + ", ".join(f"f{i}" for i in range(MAX_FALLBACKS + 1))
            + "]\n",
            f"at most {MAX_FALLBACKS} fallbacks",
        ),
        ("name: m\nmodel_id: m\nfalbacks: [x]\n", "unknown field (did you mean 'fallbacks'?)"),
    ],
)
def test_bad_aliases_and_fallbacks_in_a_file_are_named(tmp_path: Path, text: str, problem: str) -> None:
    with pytest.raises(ModelRegistryError) as caught:
        registry_of(tmp_path, text)
    assert problem in str(caught.value) and str(tmp_path / "models.yaml") in str(caught.value)


@pytest.mark.parametrize(
    ("name", "bad"),
    [
        ("chat", False),
        ("a" * MAX_ALIAS_LENGTH, False),
        ("a" * (MAX_ALIAS_LENGTH + 1), True),
        ("", True),
        ("x/y", True),
        ("_x", True),
        ("x\n", True),
        ("v1.2:latest@eu+1", False),
    ],
)
def test_alias_names_are_bounded(name: str, bad: bool) -> None:
    assert (alias_name_problem(name) is not None) == bad
