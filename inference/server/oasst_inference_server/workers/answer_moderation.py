"""The moderation hook on a connection's answers (:mod:`..moderation`), where every reader's stream is
written, so every reader of an answer (the chat API's, ``/v1``'s, on any replica) sees one decision.

Each token goes through the answer's :class:`..moderation.answer_watch.AnswerWatch` before the relay: the
word list holds back a flagged word. An answer cut (refuse or replace) is finished at once as
``complete`` with the finish reason ``content_filter`` and, for refuse, only its text before the flagged
part (replace: the configured replacement), and its worker is told to stop; the worker's own end of the
job then only frees its slot. The classifier runs beside the stream (every
``moderation_classifier_stride_chars``) and once more on the whole answer before it is stored.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from loguru import logger

from oasst_inference_server.moderation.answer_watch import AnswerWatch, Step
from oasst_inference_server.moderation.hook import Verdict
from oasst_inference_server.workers.connection_core import ConnectionCore
from oasst_inference_server.workers.in_flight import InFlight
from oasst_shared.protocol import Cancel, GeneratedText

CONTENT_FILTER = "content_filter"


class AnswerModeration(ConnectionCore):
    def _watch(self, record: InFlight) -> AnswerWatch | None:
        """The answer's watch (made at its first token), or None where answers are not moderated."""
        if self._moderation is None or record.work is None:
            return None
        if record.moderation is None:
            record.moderation = AnswerWatch(self._moderation, record.message_id)
        watch: AnswerWatch = record.moderation
        return watch

    def _spawn_moderation(self, coroutine: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.create_task(coroutine, name=name)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _moderated_token(
        self, record: InFlight, watch: AnswerWatch, text: str, logprobs: list[Any] | None
    ) -> None:
        if watch.cut is not None or watch.finishing:
            return  # cut: the rest is dropped
        step = watch.feed(text, logprobs)
        await self._apply(record, watch, step)
        if step.classify and step.cut is None:
            snapshot, length = watch.classification_started()
            self._spawn_moderation(self._classify_stream(record, watch, snapshot, length), "moderation")

    async def _apply(self, record: InFlight, watch: AnswerWatch, step: Step) -> None:
        if step.release:
            await self._relay.add(record.message_id, step.release, step.logprobs)
        for verdict in step.flags:
            self._spawn_moderation(self._record_flag(record.message_id, verdict), "moderation flag")
        if step.cut is not None:
            await self._cut(record, watch, step.cut)

    async def _record_flag(self, message_id: str, verdict: Verdict) -> None:
        assert self._moderation is not None
        await self._moderation.record(verdict, "answer", user_id=None, message_id=message_id)

    async def _user_of(self, watch: AnswerWatch) -> str:
        if watch.user_id is None:
            assert self._moderation is not None
            watch.user_id = await self._moderation.flags.user_of(watch.message_id) or ""
        return watch.user_id

    async def _classify_stream(self, record: InFlight, watch: AnswerWatch, text: str, length: int) -> None:
        assert self._moderation is not None
        try:
            (verdict,) = await self._moderation.judge(
                await self._user_of(watch), [text], [self._moderation.classifier_check]
            )
        except Exception as exc:
            logger.opt(exception=exc).error("moderation of message {} failed", watch.message_id)
            watch.classifying = False
            return
        if verdict is None:
            watch.classified_clean(length)
            return
        watch.classifying = False
        if verdict.action == "flag":
            await self._record_flag(watch.message_id, verdict)
        elif watch.cut is None and not watch.finishing and self._held.get(watch.message_id) is record:
            watch.cut = verdict
            await self._cut(record, watch, verdict)

    async def _cut(self, record: InFlight, watch: AnswerWatch, verdict: Verdict) -> None:
        """End the answer now as the verdict says; its worker is told to stop, its slot stays taken
        until the worker's end of the job."""
        await self._finish_moderated(
            record, watch, verdict, generated_tokens=record.token_frames, prompt_tokens=None
        )
        await self._send_quietly(Cancel(message_id=record.message_id))

    async def _finish_moderated(
        self,
        record: InFlight,
        watch: AnswerWatch,
        verdict: Verdict,
        *,
        generated_tokens: int,
        prompt_tokens: int | None,
    ) -> None:
        assert self._moderation is not None
        await self._record_flag(record.message_id, verdict)
        if verdict.action == "replace":
            text = self._moderation.settings.moderation_replacement
        else:
            text = watch.clean_text(verdict)
        # Not a worker's frame: a finish reason the protocol does not have, stored as it is.
        result = GeneratedText.model_construct(
            message_id=record.message_id,
            text=text,
            finish_reason=CONTENT_FILTER,
            generated_tokens=generated_tokens,
            prompt_tokens=prompt_tokens,
            tool_calls=None,
            prefix_tokens=None,
            cached_tokens=None,
        )
        await self._relay.flush()  # the terminal event comes after every token relayed
        await self._durably(
            lambda: self._lifecycle.complete(self.session_id, result), f"storing message {record.message_id}"
        )

    async def _moderated_end(self, record: InFlight, watch: AnswerWatch, result: GeneratedText) -> bool:
        """The worker finished an answer: True if moderation took care of it (stored or ended), False to
        store ``result`` as usual. A cut answer's end only frees its slot."""
        if watch.cut is not None:
            # Stored at the cut, before the worker knew its prompt's tokens: they count now.
            await self._durably(
                lambda: self._lifecycle.late_prompt_tokens(record.message_id, result.prompt_tokens),
                f"storing the prompt tokens of message {record.message_id}",
            )
            self._done(record.message_id)
            return True
        watch.finishing = True
        step = watch.finish()
        await self._apply(record, watch, step)
        if step.cut is not None:
            self._done(record.message_id)
            return True
        if self._moderation is not None and self._moderation.classifies:
            # The frame loop goes on: the slot stays taken until the answer is judged and stored.
            self._spawn_moderation(self._classify_end(record, watch, result), "moderation")
            return True
        return False

    async def _classify_end(self, record: InFlight, watch: AnswerWatch, result: GeneratedText) -> None:
        assert self._moderation is not None
        try:
            text = result.text or watch.relayed
            (verdict,) = await self._moderation.judge(
                await self._user_of(watch), [text], [self._moderation.classifier_check]
            )
            if verdict is not None and verdict.action == "flag":
                await self._record_flag(record.message_id, verdict)
            if verdict is None or verdict.action == "flag":
                await self._relay.flush()
                await self._durably(
                    lambda: self._lifecycle.complete(self.session_id, result),
                    f"storing message {record.message_id}",
                )
            else:
                await self._finish_moderated(
                    record,
                    watch,
                    verdict,
                    generated_tokens=result.generated_tokens,
                    prompt_tokens=result.prompt_tokens,
                )
        finally:
            if self._held.get(record.message_id) is record:
                self._done(record.message_id)
