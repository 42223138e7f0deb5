"""FastAPI dependencies, as annotated aliases so route signatures read like sentences.

The services are built once, at startup (``main.create_app``'s lifespan keeps them on ``app.state``);
routes reach them only through these aliases (``LifecycleDep``, ``SubmissionDep``...), which work on
HTTP requests and websockets alike.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Annotated, Any

from fastapi import Depends
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.ext.asyncio import async_sessionmaker
from sqlmodel.ext.asyncio.session import AsyncSession
from starlette.requests import HTTPConnection

from oasst_inference_server.anthropic_api.serving import AnthropicServing
from oasst_inference_server.api.scheduling_options import (
    PriorityHeader,
    QueueTimeoutHeader,
    TrustedClientHeader,
    parse_scheduling_request,
)
from oasst_inference_server.auth.api_key_store import authenticate_api_key, is_api_key
from oasst_inference_server.auth.caller import Caller
from oasst_inference_server.auth.signed_tokens import verify_token
from oasst_inference_server.auth.trusted_client import TRUSTED_CLIENT_HEADER, trusted_client_user
from oasst_inference_server.auth.user_cache import UserCache
from oasst_inference_server.broker import Broker
from oasst_inference_server.db.engine import end_read
from oasst_inference_server.db.models import DbUser
from oasst_inference_server.dispatch.message_lifecycle import MessageLifecycle
from oasst_inference_server.domain_errors import NotAuthenticated
from oasst_inference_server.fleet.switcher import ModelSwitcher
from oasst_inference_server.moderation.hook import Moderation
from oasst_inference_server.openai_api.serving_chat import ChatCompletionServing
from oasst_inference_server.openai_api.serving_completions import CompletionServing
from oasst_inference_server.openai_api.serving_embeddings import EmbeddingServing
from oasst_inference_server.openai_api.serving_models import ModelServing
from oasst_inference_server.openai_api.serving_moderations import ModerationServing
from oasst_inference_server.openai_api.serving_scoring import ScoringServing
from oasst_inference_server.openai_api.serving_tokenize import TokenizeServing
from oasst_inference_server.quotas.gate import QuotaGate
from oasst_inference_server.responses_api.serving import ResponsesServing
from oasst_inference_server.routing.alias_admin import AliasAdmin
from oasst_inference_server.scheduling.dispatcher import Dispatchers
from oasst_inference_server.scheduling.rebalancer import Rebalancer
from oasst_inference_server.scheduling.worker_registry import WorkerRegistry
from oasst_inference_server.settings import Settings
from oasst_inference_server.streams.fanout import StreamFanout
from oasst_inference_server.streams.message_reads import MessageReads
from oasst_inference_server.submission import SubmissionService
from oasst_inference_server.workers.compliance import ComplianceChecker
from oasst_inference_server.workers.compliance_store import ComplianceRecorder
from oasst_shared.schemas import SchedulingRequest


def _from_app_state(name: str) -> Callable[[HTTPConnection], Awaitable[Any]]:
    """A dependency that returns what the lifespan stored as ``app.state.<name>``.

    A coroutine function although it never awaits: FastAPI runs a plain function dependency in its
    thread pool, a hand-off to a thread and back for every one of them on every request."""

    async def dependency(connection: HTTPConnection) -> Any:
        return getattr(connection.app.state, name)

    dependency.__name__ = f"get_{name}"
    return dependency


async def get_db(connection: HTTPConnection) -> AsyncIterator[AsyncSession]:
    async with connection.app.state.session_factory() as session:
        yield session


SettingsDep = Annotated[Settings, Depends(_from_app_state("settings"))]
BrokerDep = Annotated[Broker, Depends(_from_app_state("broker"))]
StreamFanoutDep = Annotated[StreamFanout, Depends(_from_app_state("stream_fanout"))]
RegistryDep = Annotated[WorkerRegistry, Depends(_from_app_state("registry"))]
LifecycleDep = Annotated[MessageLifecycle, Depends(_from_app_state("lifecycle"))]
AliasAdminDep = Annotated[AliasAdmin, Depends(_from_app_state("alias_admin"))]
MessageReadsDep = Annotated[MessageReads, Depends(_from_app_state("message_reads"))]
DispatchersDep = Annotated[Dispatchers, Depends(_from_app_state("dispatchers"))]
ComplianceDep = Annotated[ComplianceRecorder, Depends(_from_app_state("compliance"))]
SpotChecksDep = Annotated[ComplianceChecker, Depends(_from_app_state("compliance_checker"))]
SubmissionDep = Annotated[SubmissionService, Depends(_from_app_state("submission"))]
ModerationDep = Annotated[Moderation, Depends(_from_app_state("moderation"))]
ModerationServingDep = Annotated[ModerationServing, Depends(_from_app_state("moderation_serving"))]
# One serving object per API endpoint (vLLM's ``serving`` shape): each route makes one call into its own.
ModelServingDep = Annotated[ModelServing, Depends(_from_app_state("model_serving"))]
ChatServingDep = Annotated[ChatCompletionServing, Depends(_from_app_state("chat_serving"))]
CompletionServingDep = Annotated[CompletionServing, Depends(_from_app_state("completion_serving"))]
EmbeddingServingDep = Annotated[EmbeddingServing, Depends(_from_app_state("embedding_serving"))]
ScoringServingDep = Annotated[ScoringServing, Depends(_from_app_state("scoring_serving"))]
TokenizeServingDep = Annotated[TokenizeServing, Depends(_from_app_state("tokenize_serving"))]
ResponsesServingDep = Annotated[ResponsesServing, Depends(_from_app_state("responses_serving"))]
AnthropicServingDep = Annotated[AnthropicServing, Depends(_from_app_state("anthropic_serving"))]
UserCacheDep = Annotated[UserCache, Depends(_from_app_state("user_cache"))]
ModelSwitcherDep = Annotated[ModelSwitcher, Depends(_from_app_state("model_switcher"))]
RebalancerDep = Annotated[Rebalancer, Depends(_from_app_state("rebalancer"))]
QuotaGateDep = Annotated[QuotaGate, Depends(_from_app_state("quota_gate"))]
# For work that outlives a request's session (a websocket's whole life, a report over many queries).
SessionFactoryDep = Annotated[async_sessionmaker[AsyncSession], Depends(_from_app_state("session_factory"))]
SessionDep = Annotated[AsyncSession, Depends(get_db)]

_bearer = HTTPBearer(auto_error=False)
_trusted_client = APIKeyHeader(name=TRUSTED_CLIENT_HEADER, auto_error=False, scheme_name="TrustedClient")


async def _user_of_access_token(
    settings: Settings, session: AsyncSession, users: UserCache, token: str
) -> DbUser:
    user_id, generation = verify_token(settings, token, "access")
    user = await users.get(session, user_id)
    await end_read(session)  # the request holds no connection while it works out what to do
    if user is None or user.deleted:
        raise NotAuthenticated("invalid_token", "unknown user", bearer=True)
    if generation != user.token_generation:
        raise NotAuthenticated("token_revoked", "this token was revoked: sign in again", bearer=True)
    return user


async def _user_of_api_key(session: AsyncSession, key: str) -> tuple[DbUser, str]:
    found = await authenticate_api_key(session, key)
    await end_read(session)
    if found is None:
        raise NotAuthenticated("invalid_api_key", "invalid or revoked API key", bearer=True)
    user, row = found
    return user, row.id


async def get_signed_in_user(
    settings: SettingsDep,
    session: SessionDep,
    users: UserCacheDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    trusted_client: Annotated[str | None, Depends(_trusted_client)],
) -> DbUser:
    """The user of a bearer access token, or the one a trusted frontend speaks for (no API key:
    managing keys and the account needs a sign-in)."""
    if trusted_client is not None:
        return await trusted_client_user(session, settings, trusted_client)
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise NotAuthenticated("not_authenticated", "not authenticated", bearer=True)
    return await _user_of_access_token(settings, session, users, credentials.credentials)


async def get_current_user(
    settings: SettingsDep,
    session: SessionDep,
    users: UserCacheDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    trusted_client: Annotated[str | None, Depends(_trusted_client)],
) -> DbUser:
    """As ``get_signed_in_user``, and also the owner of an API key (``Bearer oak-...``): clients
    without a browser, such as the text-client, chat with a key."""
    if trusted_client is None and credentials is not None and is_api_key(credentials.credentials):
        return (await _user_of_api_key(session, credentials.credentials))[0]
    return await get_signed_in_user(settings, session, users, credentials, trusted_client)


SignedInUser = Annotated[DbUser, Depends(get_signed_in_user)]
CurrentUser = Annotated[DbUser, Depends(get_current_user)]


async def get_scheduling_request(
    settings: SettingsDep,
    priority: PriorityHeader = None,
    queue_timeout: QueueTimeoutHeader = None,
    trusted_client: TrustedClientHeader = None,
) -> SchedulingRequest:
    """The request's scheduling options (``X-Priority``, ``X-Queue-Timeout``), checked."""
    return parse_scheduling_request(settings, priority, queue_timeout, trusted_client)


SchedulingDep = Annotated[SchedulingRequest, Depends(get_scheduling_request)]


async def get_caller(
    settings: SettingsDep,
    session: SessionDep,
    users: UserCacheDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    scheduling: SchedulingDep,
) -> Caller:
    """Accept an API key (``Authorization: Bearer oak-...``) or a user's access token."""
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise NotAuthenticated("missing_api_key", "no API key: send Authorization: Bearer <key>", bearer=True)
    token = credentials.credentials
    if is_api_key(token):
        user, key_id = await _user_of_api_key(session, token)
        return Caller(user, key_id, scheduling)
    return Caller(await _user_of_access_token(settings, session, users, token), scheduling=scheduling)


ApiCaller = Annotated[Caller, Depends(get_caller)]


_x_api_key = APIKeyHeader(name="x-api-key", auto_error=False, scheme_name="AnthropicApiKey")


async def get_anthropic_caller(
    settings: SettingsDep,
    session: SessionDep,
    users: UserCacheDep,
    x_api_key: Annotated[str | None, Depends(_x_api_key)],
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    scheduling: SchedulingDep,
) -> Caller:
    """As ``get_caller``, with the key as Anthropic's clients send it (``x-api-key``); a bearer token
    (``ANTHROPIC_AUTH_TOKEN``) works too."""
    if x_api_key:
        credentials = HTTPAuthorizationCredentials(scheme="Bearer", credentials=x_api_key)
    elif credentials is None or credentials.scheme.lower() != "bearer":
        raise NotAuthenticated("missing_api_key", "no API key: send it as x-api-key: <key>")
    return await get_caller(settings, session, users, credentials, scheduling)


AnthropicCaller = Annotated[Caller, Depends(get_anthropic_caller)]
