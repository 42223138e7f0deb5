"""What every request model of the OpenAI-compatible API shares: unknown fields are ignored (SDKs and
tools send many optional ones), and the bound on the text one request may carry."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

MAX_PROMPT_CHARACTERS = 256_000  # the whole request; the worker truncates to the model's context


class ApiRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", protected_namespaces=())
