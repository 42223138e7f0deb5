"""``POST /tokenize`` and ``POST /detokenize`` (vLLM's shapes) for generation models, answered by a
worker's backend (:mod:`oasst_inference_server.openai_api.serving_tokenize`). Errors have OpenAI's shape.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from oasst_inference_server.api.deps import ApiCaller, TokenizeServingDep
from oasst_inference_server.openai_protocol.errors import ErrorResponse
from oasst_inference_server.openai_protocol.tokenizing import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeRequest,
    TokenizeResponse,
)

router = APIRouter(tags=["openai"])

_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse, "description": description}
    for status, description in {
        400: "Invalid parameters, too long a text or too many tokens, ids the tokenizer refuses",
        401: "Missing, invalid or revoked API key",
        403: "The key or user may not use the model",
        404: "Unknown model",
        429: "The key's or user's requests per minute or budget (see Retry-After)",
        503: "No worker of the model could answer now",
    }.items()
}


@router.post("/tokenize", response_model=TokenizeResponse, responses=_ERRORS)
async def tokenize(body: TokenizeRequest, caller: ApiCaller, serving: TokenizeServingDep) -> TokenizeResponse:
    """The token ids of a prompt, or of the prompt a conversation (``messages``) renders to."""
    return await serving.tokenize(caller, body)


@router.post("/detokenize", response_model=DetokenizeResponse, responses=_ERRORS)
async def detokenize(
    body: DetokenizeRequest, caller: ApiCaller, serving: TokenizeServingDep
) -> DetokenizeResponse:
    """The text of a list of token ids."""
    return await serving.detokenize(caller, body)
