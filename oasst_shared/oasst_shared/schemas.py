"""REST and server-sent-event schemas of the inference server's chat API.

Field names and shapes follow the original Open-Assistant inference server, so its text-client,
load-test script and web frontend work against this server unchanged.
"""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from oasst_shared.limits import MAX_MESSAGE_LENGTH as MAX_MESSAGE_LENGTH  # re-exported for clients
from oasst_shared.limits import MAX_TITLE_LENGTH
from oasst_shared.logprobs import TokenLogprob
from oasst_shared.model_configs import MODEL_NAME_PATTERN, ParameterConfig
from oasst_shared.sampling import SamplingParameters
from oasst_shared.tool_calls import ToolCall


class MessageState(str, enum.Enum):
    manual = "manual"  # a prompter message, written by a person
    pending = "pending"
    in_progress = "in_progress"
    complete = "complete"
    aborted_by_worker = "aborted_by_worker"
    cancelled = "cancelled"
    timeout = "timeout"
    failed = "failed"
    refused = "refused"  # the model's backend refused the request as invalid: the request's fault

    @property
    def is_terminal(self) -> bool:
        return self not in (MessageState.pending, MessageState.in_progress)

    def __str__(self) -> str:  # in text and logs, the value (as stored), not "MessageState.pending"
        return self.value


class Role(str, enum.Enum):
    prompter = "prompter"
    assistant = "assistant"

    def __str__(self) -> str:
        return self.value


class _Request(BaseModel):
    # Unknown fields are ignored so that clients of the original server (which send e.g. ``plugins``)
    # keep working; everything we do read is validated.
    model_config = ConfigDict(extra="ignore", protected_namespaces=())


class CreateChatRequest(_Request):
    title: str | None = Field(default=None, max_length=MAX_TITLE_LENGTH)


class CreatePrompterMessageRequest(_Request):
    parent_id: str | None = None
    content: str = Field(min_length=1, max_length=MAX_MESSAGE_LENGTH)


class CreateAssistantMessageRequest(_Request):
    parent_id: str
    model_config_name: str = Field(min_length=1, max_length=128)
    sampling_parameters: SamplingParameters = Field(default_factory=SamplingParameters)
    system_prompt: str | None = Field(default=None, max_length=MAX_MESSAGE_LENGTH)


class CreateTurnRequest(_Request):
    """One call for a whole turn: the user's message and the answer to it, streamed back."""

    parent_id: str | None = Field(
        default=None, description="The assistant message this prompt replies to; null for the chat's first"
    )
    content: str = Field(min_length=1, max_length=MAX_MESSAGE_LENGTH)
    model_config_name: str = Field(min_length=1, max_length=128)
    sampling_parameters: SamplingParameters = Field(default_factory=SamplingParameters)
    system_prompt: str | None = Field(default=None, max_length=MAX_MESSAGE_LENGTH)


class MessageRead(BaseModel):
    model_config = ConfigDict(protected_namespaces=())

    id: str
    chat_id: str | None  # None for requests of the OpenAI-compatible API that are not stored as chats
    parent_id: str | None
    content: str | None
    created_at: datetime
    role: Role
    state: MessageState
    score: int = 0
    reports: list[str] = Field(default_factory=list)
    model_config_name: str | None = None
    sampling_parameters: SamplingParameters | None = None
    system_prompt: str | None = None
    error: str | None = None
    finish_reason: str | None = None
    generated_tokens: int | None = None
    prompt_tokens: int | None = None
    # Of the prompt tokens, those the worker's backend served from its prefix cache, where it tells.
    cached_tokens: int | None = None
    attempts: int = 0
    work_parameters: dict[str, object] | None = None
    # The calls the answer made instead of text (OpenAI-compatible requests with tools).
    tool_calls: list[ToolCall] | None = None


class ChatListRead(BaseModel):
    id: str
    created_at: datetime
    modified_at: datetime
    title: str | None = None
    hidden: bool = False
    allow_data_use: bool = True
    active_thread_tail_message_id: str | None = None


class ChatRead(ChatListRead):
    messages: list[MessageRead] = Field(default_factory=list)


class ListChatsResponse(BaseModel):
    chats: list[ChatListRead]
    next: str | None = None
    prev: str | None = None


class ModelConfigInfo(BaseModel):
    model_config = ConfigDict(protected_namespaces=())

    name: str
    model_id: str
    description: str = ""
    max_input_length: int
    max_total_length: int
    kind: str = "generation"
    parameter_configs: list[ParameterConfig] = Field(default_factory=list)
    worker_count: int = 0


class PluginApiType(BaseModel):
    type: str
    url: str
    has_user_authentication: bool | None = False
    is_user_authenticated: bool | None = False


class PluginAuthType(BaseModel):
    type: str


class PluginOpenAPIParameter(BaseModel):
    name: str
    in_: str
    description: str
    required: bool
    schema_: object


class PluginOpenAPIEndpoint(BaseModel):
    path: str
    type: str
    summary: str
    operation_id: str
    url: str
    params: list[PluginOpenAPIParameter]
    payload: dict[str, object] | None = None


class PluginConfig(BaseModel):
    """An OpenAI-style ``ai-plugin.json``, as the original web frontend reads it."""

    schema_version: str
    name_for_model: str
    name_for_human: str
    description_for_human: str
    description_for_model: str
    api: PluginApiType
    auth: PluginAuthType
    logo_url: str | None = None
    contact_email: str | None = None
    legal_info_url: str | None = None
    endpoints: list[PluginOpenAPIEndpoint] | None = None


class PluginEntry(BaseModel):
    """The original system's plugin entry (``/configs/builtin_plugins``, ``/configs/plugin_config``).

    This server runs no plugins (tools are OpenAI tool calls on ``/v1/chat/completions``): it lists none
    and fetches no plugin URL, so ``plugin_config`` stays empty and ``enabled`` false.
    """

    url: str = Field(max_length=2048)
    enabled: bool = True
    plugin_config: PluginConfig | None = None
    trusted: bool | None = False


class TokenPair(BaseModel):
    access_token: str
    token_type: Literal["bearer"] = "bearer"


class LoginResponse(BaseModel):
    access_token: TokenPair
    refresh_token: TokenPair | None = None


class ErrorBody(BaseModel):
    """Every error response of the REST API: a human message and a stable machine code."""

    detail: str
    code: str
    errors: list[dict[str, object]] | None = None


# ---------------------------------------------------------------- server-sent events


class CreatedEvent(BaseModel):
    """The first event of ``POST /chats/{id}/turns``: the two messages it created. Their ids let the
    client resume the answer's events with ``Last-Event-ID`` from ``.../messages/{id}/events``."""

    event_type: Literal["created"] = "created"
    prompter_message: MessageRead
    assistant_message: MessageRead


class PendingEvent(BaseModel):
    event_type: Literal["pending"] = "pending"
    queue_position: int  # 1 = dispatched next, in the fair queue's real order
    queue_size: int
    # Seconds until a worker takes the message, from the measured throughput of the model's workers.
    estimated_wait_seconds: float | None = None
    # True while no worker has the model loaded and one is loading it (or can): the message waits for a
    # load (models on demand, protocol 6). Absent otherwise.
    loading_model: bool | None = None


class TokenEvent(BaseModel):
    event_type: Literal["token"] = "token"
    text: str
    # With sampling_parameters.logprobs: the tokens this text was made of, with their log-probabilities.
    logprobs: list[TokenLogprob] | None = None


class RetryEvent(BaseModel):
    """The worker that was generating this message was lost: discard the partial text received."""

    event_type: Literal["retry"] = "retry"
    attempt: int
    reason: str


class ContinuationEvent(BaseModel):
    """The worker that was generating this message was lost, and another goes on from the text already
    streamed: keep it. The tokens that follow continue the answer (no text is repeated)."""

    event_type: Literal["continuation"] = "continuation"
    attempt: int
    reason: str


class GapEvent(BaseModel):
    """The reader resumed from an event the stream no longer holds (trimmed to its length limit):
    events were lost. Discard the partial text; the terminal ``message`` event has the whole answer."""

    event_type: Literal["gap"] = "gap"
    detail: str


class MessageEvent(BaseModel):
    event_type: Literal["message"] = "message"
    message: MessageRead


class ErrorEvent(BaseModel):
    event_type: Literal["error"] = "error"
    error: str
    message: MessageRead | None = None


StreamEvent = Annotated[
    CreatedEvent
    | PendingEvent
    | TokenEvent
    | RetryEvent
    | ContinuationEvent
    | GapEvent
    | MessageEvent
    | ErrorEvent,
    Field(discriminator="event_type"),
]
TERMINAL_EVENT_TYPES = frozenset({"message", "error"})


# ---------------------------------------------------------------- API keys and usage


class CreateApiKeyRequest(_Request):
    name: str = Field(min_length=1, max_length=100)


class ApiKeyRead(BaseModel):
    id: str
    name: str
    prefix: str  # the key's first characters, to tell keys apart
    created_at: datetime
    last_used_at: datetime | None = None
    revoked_at: datetime | None = None


class ApiKeyCreated(ApiKeyRead):
    key: str  # the secret itself: returned once, never again


class ListApiKeysResponse(BaseModel):
    api_keys: list[ApiKeyRead]


class UsageTotals(BaseModel):
    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


class ApiKeyUsage(UsageTotals):
    api_key_id: str
    name: str
    prefix: str
    revoked: bool = False


class UsageRead(BaseModel):
    """A user's generations (chat answers, completions, embeddings) and their tokens."""

    total: UsageTotals
    api_keys: list[ApiKeyUsage]
    # Requests made with the user's access token rather than a key (the chat API, and /v1 with a token).
    without_api_key: UsageTotals


class ApiRequestRead(BaseModel):
    """One request of the OpenAI-compatible API, as its usage record (the content is not kept)."""

    model_config = ConfigDict(protected_namespaces=())

    id: str
    kind: str  # "completion" | "embedding"
    api_key_id: str | None = None
    model_config_name: str | None = None
    state: MessageState
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    error: str | None = None
    chat_id: str | None = None  # set when the server stores API conversations as chats
    created_at: datetime
    finished_at: datetime | None = None


class ListApiRequestsResponse(BaseModel):
    requests: list[ApiRequestRead]


# ---------------------------------------------------------------- chat management, auth, admin


class ChatUpdateRequest(_Request):
    """PUT/PATCH ``/chats/{id}``: only the fields given are changed (the original server's shape)."""

    title: str | None = Field(default=None, max_length=MAX_TITLE_LENGTH)
    hidden: bool | None = None
    allow_data_use: bool | None = None
    active_thread_tail_message_id: str | None = None


class VoteRequest(_Request):
    score: int = Field(ge=-1, le=1, description="-1 (bad), 0 (no vote) or 1 (good)")


class ReportType(str, enum.Enum):
    spam = "spam"
    offensive = "offensive"
    feedback = "feedback"


class ReportRequest(_Request):
    report_type: ReportType
    reason: str = Field(default="", max_length=2000)


class MessageEvalRequest(_Request):
    """The message of the URL is preferred over these siblings (other answers to the same prompt)."""

    inferior_message_ids: list[str] = Field(min_length=1, max_length=32)


class RefreshRequest(_Request):
    refresh_token: str = Field(min_length=1, max_length=512)


class UserRead(BaseModel):
    id: str
    provider: str
    provider_account_id: str
    display_name: str
    created_at: datetime


class AccountRead(UserRead):
    """The signed-in user, as ``GET /account`` shows them."""

    is_admin: bool = Field(
        default=False,
        description="The user may use the admin API with their access token (the web chat shows its admin page)",
    )


class UserSettings(_Request):
    """A user's choices that clients keep on the server (the web chat page: model, sampling, theme).

    Stored as given, per user; ``GET /account/settings`` returns the defaults before the first save.
    """

    model_config_name: str | None = Field(default=None, max_length=128)
    preset: str | None = Field(
        default=None, max_length=64, description="A parameter_configs name of the model, or 'custom'"
    )
    custom_sampling_parameters: SamplingParameters | None = None
    theme: Literal["system", "light", "dark"] = "system"


class AuthCheckResponse(BaseModel):
    user_id: str
    display_name: str


class WorkerLimits(_Request):
    """What a worker key allows; a worker that announces more is refused (close code 4003).
    None: any model config, ``max_slots_per_worker`` slots, any number of sockets."""

    allowed_models: (
        list[Annotated[str, Field(min_length=1, max_length=128, pattern=MODEL_NAME_PATTERN)]] | None
    ) = Field(default=None, max_length=100, description="The model config names the key may serve")
    max_slots: int | None = Field(default=None, ge=1, le=1024, description="Parallel requests per socket")
    max_sockets: int | None = Field(default=None, ge=1, le=10_000, description="Sockets open at once")


class CreateWorkerRequest(WorkerLimits):
    name: str = Field(min_length=1, max_length=128)


class WorkerRead(BaseModel):
    id: str
    name: str
    api_key_prefix: str
    created_at: datetime
    connected_sessions: int = 0
    allowed_models: list[str] | None = None
    max_slots: int | None = None
    max_sockets: int | None = None
    trusted: bool = Field(default=False, description="Trusted workers are never compliance-checked")
    flagged_at: datetime | None = Field(
        default=None, description="When the key failed too many compliance checks (it gets no user work)"
    )
    flag_reason: str | None = Field(default=None, description="Why it was flagged")


class WorkerTrustUpdate(_Request):
    """Trust a worker key or not, and clear its compliance flag; its open sockets reconnect under it."""

    trusted: bool = Field(description="Trusted keys are never compliance-checked and answer the checks")
    clear_flag: bool = Field(
        default=False, description="Lift the compliance flag (the key takes user work again)"
    )


class ComplianceCheckRead(BaseModel):
    """One compliance check of a worker: a greedy job compared with a trusted worker's answer, or a
    usage claim compared with the server's own count."""

    model_config = ConfigDict(protected_namespaces=())

    id: str
    worker_id: str | None = Field(description="The registered worker; null for a static key")
    session_id: str = Field(description="The socket checked")
    reference_session_id: str | None = Field(description="The trusted socket that gave the expected answer")
    model_config_name: str
    kind: str = Field(
        description="`output` (a check job), `spot` (a user job replayed on a trusted worker) or `usage` "
        "(token counts of any job)"
    )
    outcome: str = Field(description="`passed`, `failed` or `inconclusive` (timeouts, backend errors)")
    detail: str = Field(description="What differed, or why the check was inconclusive")
    prompt: str | None = None
    expected_text: str | None = Field(default=None, description="The trusted worker's answer")
    actual_text: str | None = Field(default=None, description="The checked worker's answer")
    created_at: datetime


class WorkerCreated(WorkerRead):
    """Returned once, when a worker is created or its key replaced: store ``api_key`` now."""

    api_key: str


class SchedulingRequest(BaseModel):
    """What a request may ask of the scheduler (headers ``X-Priority``, ``X-Queue-Timeout``; the server
    checks them against its settings)."""

    priority: int = 0  # trusted clients only
    queue_timeout: float | None = None  # shorter than settings.queue_timeout


class UserBacklog(BaseModel):
    user_id: str
    waiting: int  # hints of this user in the fair queue
    counter: float  # the user's weighted tokens served, as the fair queue counts them


class UserService(BaseModel):
    user_id: str
    tokens: int  # prompt + generated tokens of the user's messages finished in the window


class WorkerLoad(BaseModel):
    session_id: str
    max_parallel_requests: int | None = None
    in_flight: int = 0
    free_slots: int | None = None
    kv_cache_free_tokens: int | None = None
    backend_queue_length: int | None = None
    tokens_per_second: float | None = None


class ModelQueueStatus(BaseModel):
    model_config = ConfigDict(protected_namespaces=())

    model_config_name: str
    depth: int  # pending messages (database)
    oldest_wait_seconds: float | None = None
    backlog: list[UserBacklog] = Field(default_factory=list)  # users with waiting messages
    workers: list[WorkerLoad] = Field(default_factory=list)
    service: list[UserService] = Field(default_factory=list)  # the top users of the window


class QueueStatus(BaseModel):
    window_seconds: float
    models: list[ModelQueueStatus]


class UserAdminUpdate(_Request):
    """Make a user an admin user (their access token may use the admin API) or not."""

    admin: bool = Field(
        description="True: an admin user; false: not (unless settings.admin_users lists them)"
    )


class UserTierUpdate(BaseModel):
    tier: str | None = Field(default=None, max_length=32, description="None: the server's default tier")


class WorkerSessionRead(BaseModel):
    model_config = ConfigDict(protected_namespaces=())

    session_id: str
    model_config_name: str
    worker_id: str | None = None
    worker_name: str | None = None
    max_parallel_requests: int | None = None
    free_slots: int | None = None
    in_flight: list[str] = Field(default_factory=list)
    backend_kind: str | None = None
    backend_healthy: bool | None = None
    draining: bool | None = None
    worker_version: str | None = None
    connected_at: float | None = None
    backend_model_id: str | None = Field(default=None, description="The model its backend says it serves")
    backend_model_revision: str | None = Field(
        default=None, description="The model's revision or file hash, where the backend tells"
    )
    backend_version: str | None = Field(default=None, description="The backend's build, where it tells")
    trusted: bool | None = Field(default=None, description="Whether the worker's key is trusted")
    flagged: bool | None = Field(
        default=None, description="The key failed compliance checks and gets no user work"
    )


class RevokedTokensResponse(BaseModel):
    revoked: int


class AdminUserRead(UserRead):
    is_admin: bool = Field(
        default=False, description="An admin user (flagged, or listed in settings.admin_users)"
    )
    deleted: bool = False
    chat_count: int = 0
    tier: str | None = None  # None: the server's default tier
