"""Token log-probabilities, in the shape of OpenAI's ``ChatCompletionTokenLogprob``.

The worker attaches them to the token frames it sends (one entry per backend token, in order), the
server relays them on the token events and the OpenAI-compatible API answers with them unchanged.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

MAX_TOP_LOGPROBS = 20  # OpenAI's bound for top_logprobs


class TopLogprob(BaseModel):
    token: str = Field(description="The token's text.")
    logprob: float = Field(description="Its log-probability.")
    bytes: list[int] | None = Field(None, description="Its UTF-8 bytes.")


class TokenLogprob(TopLogprob):
    """One generated token: its log-probability and the most likely alternatives at its position."""

    top_logprobs: list[TopLogprob] = Field(
        default_factory=list, description="The most likely tokens at its position, most likely first."
    )


def token_bytes(text: str) -> list[int]:
    return list(text.encode("utf-8"))
