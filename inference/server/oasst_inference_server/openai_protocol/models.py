"""``/v1/models``: the models the fleet serves or can load, with their context length, kind, quantization
and whether a worker has them loaded, and the aliases that stand for them (extensions: OpenAI's model object has ``id``, ``object``,
``created`` and ``owned_by``; clients ignore the rest)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict


class ModelCard(BaseModel):
    model_config = ConfigDict(protected_namespaces=())

    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "oasst"
    # Extensions: the model's context length (prompt plus answer, in tokens) and its kind; the workers that
    # have it loaded, whether any has (a request for one nobody has loaded waits while a worker loads
    # it), the workers that can load it, and its quantization.
    context_length: int
    max_input_length: int
    kind: str = "generation"
    worker_count: int = 0
    loaded: bool = True
    loadable_worker_count: int = 0
    quantization: str = "none"
    # For an alias (docs/operating.md#model-aliases-and-fallbacks): the model config it stands for. The other fields are those
    # of the model that would serve it now (the config, or a fallback).
    alias_of: str | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
