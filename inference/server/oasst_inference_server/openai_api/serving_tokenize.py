"""``/tokenize`` and ``/detokenize`` for generation models, answered by a worker's backend.

The server has no tokenizer: it asks a worker of the model (protocol 4 ``tokenize`` with the token ids,
``detokenize``), as it asks one to count prompts (:mod:`..workers.prompt_sizes`: trusted workers first,
a worker of another replica when none is here). A conversation is tokenized as the prompt the worker
renders for a chat completion, a prompt as a completion's, so the counts are the ``prompt_tokens`` a
generation reports.
"""

from __future__ import annotations

from pydantic import ValidationError

from oasst_inference_server.admission.request_bounds import check_chat_completion_bounds
from oasst_inference_server.auth.caller import Caller
from oasst_inference_server.domain_errors import InvalidRequest, ServiceUnavailable
from oasst_inference_server.openai_api.openai_service import OpenAIService
from oasst_inference_server.openai_protocol.generation_requests import ChatCompletionRequest
from oasst_inference_server.openai_protocol.tokenizing import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeRequest,
    TokenizeResponse,
)
from oasst_inference_server.scheduling.worker_registry import LiveModel
from oasst_inference_server.workers.prompt_sizes import PromptSizes
from oasst_inference_server.workers.worker_calls import WorkerCalls
from oasst_shared.protocol import (
    Detokenize,
    Detokenized,
    PromptConversation,
    Tokenize,
    Tokenized,
    TokenizeInput,
)

_REFUSED = "could not answer"  # what a worker's error answer says (WorkerCalls, RemoteQuestions)


class TokenizeServing:
    def __init__(self, service: OpenAIService, sizes: PromptSizes) -> None:
        self._service = service
        self._settings = service.settings
        self._sizes = sizes

    async def tokenize(self, caller: Caller, body: TokenizeRequest) -> TokenizeResponse:
        """The token ids of a prompt, or of the prompt a conversation (``messages``) renders to."""
        model = await self._service.resolve_model(body.model, "generation", load=False)
        tokenize_input = self._input(body)
        await self._service.admit_question(caller, model)
        question = Tokenize(request_id=WorkerCalls.new_id(), inputs=[tokenize_input], counts_only=False)
        answer = await self._ask(model, question)
        assert isinstance(answer, Tokenized) and answer.token_ids is not None  # PromptSizes.ask checks
        return TokenizeResponse(
            count=answer.counts[0], max_model_len=model.config.max_total_length, tokens=answer.token_ids[0]
        )

    async def detokenize(self, caller: Caller, body: DetokenizeRequest) -> DetokenizeResponse:
        """The text of a list of token ids."""
        model = await self._service.resolve_model(body.model, "generation", load=False)
        await self._service.admit_question(caller, model)
        question = Detokenize(request_id=WorkerCalls.new_id(), token_ids=[body.tokens])
        answer = await self._ask(model, question)
        assert isinstance(answer, Detokenized)
        return DetokenizeResponse(prompt=answer.texts[0])

    def _input(self, body: TokenizeRequest) -> TokenizeInput:
        try:
            if body.prompt is not None:
                return TokenizeInput(text=body.prompt)
            chat = ChatCompletionRequest(model=body.model, messages=body.messages or [], tools=body.tools)
            check_chat_completion_bounds(self._settings, chat)
            system_prompt, thread = chat.to_thread()
            if not thread:
                raise InvalidRequest(
                    "invalid_value", "messages: a conversation needs a turn after the system prompt"
                )
            return TokenizeInput(
                conversation=PromptConversation(thread=thread, system_prompt=system_prompt, tools=body.tools)
            )
        except ValidationError as exc:
            first = exc.errors(include_url=False)[0]
            raise InvalidRequest("invalid_value", f"{first['msg']}", param="messages") from None

    async def _ask(self, model: LiveModel, question: Tokenize | Detokenize) -> Tokenized | Detokenized:
        if not model.capabilities.tokenize:
            raise InvalidRequest(
                "tokenize_unsupported",
                f"the workers of {model.config.name!r} cannot {question.type} (their backend has no tokenizer "
                "endpoint)",
                param="model",
            )
        failures: list[str] = []
        answer = await self._sizes.ask(model.config.name, question, failures)
        if answer is not None:
            return answer
        if failures and all(_REFUSED in failure for failure in failures):
            # The backend refused these inputs (token ids it does not know, a template that fails).
            raise InvalidRequest(
                f"{question.type}_failed", f"the model's tokenizer refused: {failures[-1][:500]}"
            )
        raise ServiceUnavailable(
            "tokenizer_unavailable",
            f"no worker of {model.config.name!r} could {question.type} now: try again",
        )
