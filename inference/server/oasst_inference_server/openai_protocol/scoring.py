"""Rerank and score on embedding models: the wire shapes of ``/v1/rerank`` (Cohere's and Jina's) and
``/v1/score`` (vLLM's).

Both are answered from the embeddings of the texts (the cosine similarity of the query's, or of each
``text_1``'s, to each document's, or ``text_2``'s), as vLLM does for embedding models. Every text is
bounded: how many, and how long they are together.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from oasst_inference_server.openai_protocol.request_base import MAX_PROMPT_CHARACTERS
from oasst_inference_server.openai_protocol.usage import UsageInfo

MAX_RERANK_DOCUMENTS = 1000  # and the query: one embedding request of at most 1001 inputs
MAX_SCORE_TEXTS = 1000  # per side of a score request


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore", protected_namespaces=())


class RerankDocument(BaseModel):
    model_config = ConfigDict(extra="ignore")

    text: str


def _check_texts(texts: list[str], what: str, most: int) -> None:
    if not texts:
        raise ValueError(f"{what} is empty")
    if len(texts) > most:
        raise ValueError(f"at most {most} {what} per request")
    if any(not t for t in texts):
        raise ValueError(f"{what} must not be empty strings")


class RerankRequest(_Request):
    model: str = Field(min_length=1, max_length=128)
    query: str = Field(min_length=1)
    documents: list[str | RerankDocument]
    top_n: int | None = Field(default=None, ge=0, description="The best n only; 0 or none: all of them")
    return_documents: bool = True

    @field_validator("documents")
    @classmethod
    def _bounded(cls, value: list[str | RerankDocument]) -> list[str | RerankDocument]:
        _check_texts([d if isinstance(d, str) else d.text for d in value], "documents", MAX_RERANK_DOCUMENTS)
        return value

    @model_validator(mode="after")
    def _total_size(self) -> RerankRequest:
        if len(self.query) + sum(len(t) for t in self.texts) > MAX_PROMPT_CHARACTERS:
            raise ValueError(f"the query and documents exceed {MAX_PROMPT_CHARACTERS} characters")
        return self

    @property
    def texts(self) -> list[str]:
        return [d if isinstance(d, str) else d.text for d in self.documents]


class RerankResult(BaseModel):
    index: int
    relevance_score: float
    document: RerankDocument | None = None


class RerankResponse(BaseModel):
    id: str
    model: str
    results: list[RerankResult]
    usage: UsageInfo


class ScoreRequest(_Request):
    """``text_1`` against ``text_2``: one against one, one against each of a list, or pairwise (lists of
    the same length)."""

    model: str = Field(min_length=1, max_length=128)
    text_1: str | list[str]
    text_2: str | list[str]

    @model_validator(mode="after")
    def _pairs(self) -> ScoreRequest:
        left, right = self.lefts, self.rights
        _check_texts(left, "text_1", MAX_SCORE_TEXTS)
        _check_texts(right, "text_2", MAX_SCORE_TEXTS)
        if len(left) > 1 and len(left) != len(right):
            raise ValueError("text_1 and text_2 lists must have the same length (or text_1 one text)")
        if sum(len(t) for t in left) + sum(len(t) for t in right) > MAX_PROMPT_CHARACTERS:
            raise ValueError(f"the texts exceed {MAX_PROMPT_CHARACTERS} characters")
        return self

    @property
    def lefts(self) -> list[str]:
        return [self.text_1] if isinstance(self.text_1, str) else self.text_1

    @property
    def rights(self) -> list[str]:
        return [self.text_2] if isinstance(self.text_2, str) else self.text_2

    def pairs(self) -> list[tuple[int, int]]:
        """Each score's (text_1 index, text_2 index), in answer order."""
        left, right = self.lefts, self.rights
        if len(left) == 1:
            return [(0, j) for j in range(len(right))]
        return [(i, i) for i in range(len(left))]


class ScoreData(BaseModel):
    index: int
    object: Literal["score"] = "score"
    score: float


class ScoreResponse(BaseModel):
    id: str
    object: Literal["list"] = "list"
    created: int
    model: str
    data: list[ScoreData]
    usage: UsageInfo
