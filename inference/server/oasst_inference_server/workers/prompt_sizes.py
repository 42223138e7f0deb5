"""A prompt's size in its model's own tokens, for admission: from a bound when the bound settles it,
else counted by a worker of the model (protocol 4 ``tokenize``) and remembered.

The server has no tokenizer; the workers' backends have the model's. Asking one is a round trip, so
most prompts are not counted at all: no tokenizer makes more tokens of a text than its UTF-8 bytes plus
a few (``oasst_shared.token_bounds``), and the rendered prompt of a conversation holds its turns' text
plus what the model's chat template adds. That addition is the model's calibration: the workers report
it (``prompt_overhead_bytes``, measured on their template) and every count a worker answers shows it
again (its ``prompt_bytes`` less the turns' text), the larger kept. A prompt whose bound is within the
limit fits and needs no count; only a longer one is counted, once: the counts are kept per model in an
LRU of the input's digest. A count decides whether a request is refused, so trusted workers are asked
first, flagged ones never, and an answer no tokenizer could give (more tokens than bytes) is not used.

The workers of this process that said they count are asked first; when none is here, a counting worker
of another replica is asked through the broker (:mod:`.remote_questions`). When none counts or none
answers within ``timeout``, the size is unknown (None) and the caller decides.

May import dispatch, workers (calls, trust, remote questions), settings; not api, openai_api, submission or admission.
"""

from __future__ import annotations

import functools
import hashlib
import random
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, cast

from loguru import logger

from oasst_inference_server.broker import BrokerError
from oasst_inference_server.broker.session_view import SessionSnapshot, WorkerSessionView
from oasst_inference_server.broker.worker_session import WorkerSession
from oasst_inference_server.scheduling.dispatcher import Dispatchers, ModelDispatcher
from oasst_inference_server.workers.remote_questions import RemoteQuestions
from oasst_inference_server.workers.trust import WorkerTrust
from oasst_inference_server.workers.worker_calls import CallFailed, WorkerCalls
from oasst_shared.protocol import Detokenize, Detokenized, Tokenize, Tokenized, TokenizeInput
from oasst_shared.token_bounds import ADDED_TOKENS, utf8_bytes

DEFAULT_CACHE_SIZE = 10_000
# More than any chat template adds to a system prompt and one turn: a larger claim is not believed.
MAX_TEMPLATE_BYTES = 65_536


class CountsTokens(Protocol):
    """What a count needs of a worker connection (``worker_connection.WorkerConnection``)."""

    session_id: str
    draining: bool
    calls: WorkerCalls
    trust: WorkerTrust

    @property
    def tokenizes(self) -> bool: ...

    @property
    def switching(self) -> bool: ...

    async def tokenize(self, question: Tokenize, timeout: float) -> Tokenized: ...


@dataclass(frozen=True)
class PromptSize:
    tokens: int
    # False: ``tokens`` is an upper bound, within the limit asked about (the prompt fits).
    exact: bool


class PromptSizes:
    def __init__(
        self,
        dispatchers: Dispatchers,
        *,
        timeout: float,
        cache_size: int = DEFAULT_CACHE_SIZE,
        sessions: WorkerSessionView | None = None,
        remote: RemoteQuestions | None = None,
    ) -> None:
        self._dispatchers = dispatchers
        self._sessions = sessions
        self._remote = remote
        self._timeout = timeout
        self._cache_size = cache_size
        self._counts: OrderedDict[tuple[str, bytes], int] = OrderedDict()
        # Model -> the most bytes its chat template was seen to add to a conversation's text.
        self._overheads: dict[str, int] = {}
        # Who can count, per model, rebuilt only when the workers change (a dispatcher's ``version``, a
        # new read of the sessions), not scanned over a thousand workers per request: this process's
        # workers of the model that count, and the other replicas' (trusted ones alone where any is).
        self._local_counters: dict[str, tuple[ModelDispatcher, int, list[CountsTokens]]] = {}
        self._remote_counters: dict[str, tuple[SessionSnapshot, int, list[str]]] = {}
        self.asked = 0  # counts asked of workers (for tests and the logs)

    async def size(
        self, model: str, prompt: TokenizeInput, limit: int, reported_overhead: int | None = None
    ) -> PromptSize | None:
        """``prompt``'s tokens for ``model``: a bound if the bound is within ``limit``, else the exact
        count (remembered, or asked of a worker of this process); None if no worker could tell.
        ``reported_overhead``: what the model's workers report their template adds (the live model's
        ``prompt_overhead_bytes``)."""
        bound = self._bound(model, prompt, reported_overhead)
        if bound is not None and bound <= limit:
            return PromptSize(bound, exact=False)
        key = (model, hashlib.sha256(prompt.model_dump_json().encode()).digest())
        known = self._counts.get(key)
        if known is not None:
            self._counts.move_to_end(key)
            return PromptSize(known, exact=True)
        answer = await self._ask(model, prompt)
        if answer is None:
            return None
        tokens = answer.counts[0]
        self._counts[key] = tokens
        if len(self._counts) > self._cache_size:
            self._counts.popitem(last=False)
        self._learn(model, prompt, answer.prompt_bytes[0] if answer.prompt_bytes else None)
        return PromptSize(tokens, exact=True)

    def _bound(self, model: str, prompt: TokenizeInput, reported_overhead: int | None) -> int | None:
        """At least the prompt's tokens, or None where no bound is known (tools: the template renders
        them as it likes; no calibration for the model yet)."""
        if prompt.text is not None:
            return utf8_bytes(prompt.text) + ADDED_TOKENS
        text = _conversation_bytes(prompt)
        overhead = max(reported_overhead or 0, self._overheads.get(model, 0))
        if text is None or (reported_overhead is None and model not in self._overheads):
            return None
        return text + overhead + ADDED_TOKENS

    def _learn(self, model: str, prompt: TokenizeInput, rendered_bytes: int | None) -> None:
        text = _conversation_bytes(prompt)
        if text is None or rendered_bytes is None:
            return
        added = rendered_bytes - text
        if added > self._overheads.get(model, -1):
            self._overheads[model] = added

    async def _ask(self, model: str, prompt: TokenizeInput) -> Tokenized | None:
        question = Tokenize(request_id=WorkerCalls.new_id(), inputs=[prompt])
        answer = await self._first_answer(model, question, functools.partial(_implausible, prompt))
        assert answer is None or isinstance(answer, Tokenized)  # _implausible says so
        return answer

    async def ask(
        self, model: str, question: Tokenize | Detokenize, failures: list[str] | None = None
    ) -> Tokenized | Detokenized | None:
        """The answer of a worker of ``model`` to any question (token ids, texts of token ids: the
        ``/tokenize`` and ``/detokenize`` APIs), asked as counts are; None if none could answer (why each
        asked worker could not is added to ``failures``)."""
        return await self._first_answer(model, question, functools.partial(_unanswered, question), failures)

    async def _first_answer(
        self,
        model: str,
        question: Tokenize | Detokenize,
        problem_of: Callable[[Tokenized | Detokenized], str | None],
        failures: list[str] | None = None,
    ) -> Tokenized | Detokenized | None:
        askers: list[tuple[str, Callable[[], Awaitable[Tokenized | Detokenized]]]] = [
            (c.session_id, functools.partial(c.calls.ask, question, self._timeout))
            for c in self._counting_workers(model)[:2]  # a second try if the first fails
        ]
        if not askers and self._remote is not None:
            remote = self._remote
            askers = [
                (session_id, functools.partial(remote.ask, session_id, question, self._timeout))
                for session_id in await self._remote_workers(model)
            ]
        for session_id, ask in askers:
            self.asked += 1
            try:
                answer = await ask()
            except CallFailed as exc:
                logger.warning("worker {} could not answer a {}: {}", session_id, question.type, exc)
                if failures is not None:
                    failures.append(str(exc))
                continue
            problem = problem_of(answer)
            if problem is not None:
                logger.warning(
                    "worker {}'s answer to a {} is not used: {}", session_id, question.type, problem
                )
                continue
            return answer
        return None

    async def _remote_workers(self, model: str) -> list[str]:
        """One counting worker of ``model`` connected to another replica (from the broker's sessions),
        chosen at random so that the replicas' questions spread over them; none if there is none."""
        if self._sessions is None:
            return []
        try:
            snapshot = await self._sessions.snapshot()
        except BrokerError:
            return []
        here = self._dispatchers.by_model.get(model)
        version = here.version if here is not None else -1
        cached = self._remote_counters.get(model)
        if cached is None or cached[0] is not snapshot or cached[1] != version:
            cached = self._remote_counters[model] = (
                snapshot,
                version,
                self._remote_pool(model, snapshot.sessions),
            )
        pool = cached[2]
        return random.sample(pool, 1) if pool else []

    def _remote_pool(self, model: str, sessions: Mapping[str, WorkerSession]) -> list[str]:
        here = self._dispatchers.by_model.get(model)
        local = set(here.workers) if here is not None else set()
        able = [
            (session_id, session.trusted)
            for session_id, session in sessions.items()
            if session.serves == model
            and session.capabilities.tokenize
            and not session.draining
            and not session.flagged
            and session_id not in local
        ]
        trusted = [session_id for session_id, is_trusted in able if is_trusted]
        return trusted or [session_id for session_id, _ in able]

    def _counting_workers(self, model: str) -> Sequence[CountsTokens]:
        """The workers of this process that count for ``model``: trusted ones first (a count decides
        whether a request is refused), then the least busy with questions; never a flagged one."""
        dispatcher = self._dispatchers.by_model.get(model)
        if dispatcher is None:
            return []
        cached = self._local_counters.get(model)
        if cached is None or cached[0] is not dispatcher or cached[1] != dispatcher.version:
            # Whether a connection counts at all is fixed by its handshake; the rest is read per count.
            counting = [cast(CountsTokens, w) for w in dispatcher.workers.values()]
            cached = (dispatcher, dispatcher.version, [w for w in counting if w.tokenizes])
            self._local_counters[model] = cached
        able = [w for w in cached[2] if not w.draining and not w.switching and not w.trust.flagged]
        return sorted(able, key=lambda w: (not w.trust.trusted, w.calls.open_count))


def _unanswered(question: Tokenize | Detokenize, answer: Tokenized | Detokenized) -> str | None:
    """Why ``answer`` does not answer ``question`` in full (the token ids or texts asked for), or None."""
    if isinstance(question, Tokenize):
        if not isinstance(answer, Tokenized) or len(answer.counts) != len(question.inputs):
            return "not one count per input"
        ids = answer.token_ids
        if not question.counts_only and (ids is None or [len(i) for i in ids] != answer.counts):
            return "not the token ids of each input"
        return None
    if not isinstance(answer, Detokenized) or len(answer.texts) != len(question.token_ids):
        return "not one text per list of token ids"
    return None


def _implausible(prompt: TokenizeInput, answer: Tokenized | Detokenized) -> str | None:
    """Why a worker's answer to a count of ``prompt`` cannot be right, or None. No tokenizer makes more
    tokens of a text than its bytes and a few; the text counted holds at least the prompt's own text (a
    conversation's rendered prompt) or is exactly it (a text)."""
    if not isinstance(answer, Tokenized) or len(answer.counts) != 1 or len(answer.prompt_bytes) != 1:
        return "not one count and one size for one prompt"
    (tokens,), (size,) = answer.counts, answer.prompt_bytes
    text = utf8_bytes(prompt.text) if prompt.text is not None else None
    if text is not None and size != text:
        return f"it counted {size} bytes of a text of {text}"
    least = _conversation_bytes(prompt)
    if least is not None and not least <= size <= least + MAX_TEMPLATE_BYTES:
        return f"it counted {size} bytes of a conversation whose text has {least}"
    if tokens > size + ADDED_TOKENS:
        return f"{tokens} tokens in {size} bytes"
    return None


def _conversation_bytes(prompt: TokenizeInput) -> int | None:
    """The UTF-8 bytes of the text of a conversation of a system prompt and one turn, what its rendered
    prompt holds besides what the template adds to such a conversation (``prompt_overhead_bytes``);
    None for any other (more turns, tools, tool calls or results: the prompt holds more than that)."""
    conversation = prompt.conversation
    if conversation is None or conversation.tools:
        return None
    turns = conversation.thread[1:] if conversation.thread[0].role == "system" else conversation.thread
    if len(turns) != 1 or turns[0].role not in ("user", "assistant") or turns[0].tool_calls:
        return None
    return utf8_bytes(conversation.system_prompt or "") + sum(
        utf8_bytes(t.content) for t in conversation.thread
    )
