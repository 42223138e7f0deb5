"""Sign-in: debug logins, OAuth (GitHub, Discord), trusted frontends, and refresh-token rotation."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Cookie, Header, Query
from fastapi.responses import RedirectResponse, Response

from oasst_inference_server.api.deps import CurrentUser, SessionDep, SettingsDep
from oasst_inference_server.api.responses import AUTH, error
from oasst_inference_server.api.routes.web import signin_handoff
from oasst_inference_server.auth import oauth, refresh_tokens
from oasst_inference_server.auth.trusted_client import TRUSTED_CLIENT_HEADER, trusted_client_user
from oasst_inference_server.auth.users import get_or_create_user
from oasst_inference_server.db.models import DbUser
from oasst_inference_server.domain_errors import DomainError, InvalidValue, NotAuthenticated, NotPermitted
from oasst_shared.schemas import AuthCheckResponse, LoginResponse, RefreshRequest, UserRead

router = APIRouter(prefix="/auth", tags=["auth"])

_USERNAME = r"^[A-Za-z0-9_.@-]+$"


def user_read(user: DbUser) -> UserRead:
    return UserRead(
        id=user.id,
        provider=user.provider,
        provider_account_id=user.provider_account_id,
        display_name=user.display_name,
        created_at=user.created_at,
    )


@router.get("/providers", response_model=list[str])
async def providers(settings: SettingsDep) -> list[str]:
    """The sign-in methods this server offers (``debug`` only when debug login is enabled)."""
    names = sorted(oauth.configured_providers(settings))
    if settings.allow_debug_auth:
        names.append("debug")
    return names


@router.get("/check", response_model=AuthCheckResponse, responses=AUTH)
async def check(user: CurrentUser) -> AuthCheckResponse:
    """The user the bearer token (or ``TrustedClient`` header) belongs to."""
    return AuthCheckResponse(user_id=user.id, display_name=user.display_name)


@router.post(
    "/refresh",
    response_model=LoginResponse,
    responses={
        401: error("Unknown, expired, revoked or reused refresh token (reuse signs out the whole family)"),
        422: error("No refresh token given"),
    },
)
async def refresh(
    settings: SettingsDep,
    session: SessionDep,
    body: RefreshRequest | None = None,
    refresh_header: Annotated[str | None, Header(alias="Refresh")] = None,
) -> LoginResponse:
    """Exchange a refresh token (JSON body, or the ``Refresh`` header) for a new access token and a
    new refresh token. The old refresh token is used up; presenting it again revokes its family."""
    presented = body.refresh_token if body else refresh_header
    if not presented:
        raise InvalidValue("validation_error", "give refresh_token in the body or the Refresh header")
    return await refresh_tokens.refresh(session, settings, presented)


@router.post("/logout", status_code=204, responses={422: error("No refresh token given")})
async def logout(session: SessionDep, body: RefreshRequest) -> Response:
    """Revoke the refresh token's family (this sign-in and every refresh of it)."""
    await refresh_tokens.revoke_family_of(session, body.refresh_token)
    return Response(status_code=204)


@router.post(
    "/trusted",
    response_model=UserRead,
    responses={
        401: error("Missing or invalid TrustedClient header, or an unknown frontend API key"),
        409: error("The client account is linked to another user id"),
    },
)
async def login_trusted(
    settings: SettingsDep,
    session: SessionDep,
    trusted_client: Annotated[str | None, Header(alias=TRUSTED_CLIENT_HEADER)] = None,
) -> UserRead:
    """A trusted frontend registers (or finds) the user its ``TrustedClient`` header names."""
    if trusted_client is None:
        raise NotAuthenticated("not_authenticated", "missing TrustedClient header")
    return user_read(await trusted_client_user(session, settings, trusted_client))


@router.get(
    "/login/debug",
    status_code=307,
    response_class=RedirectResponse,
    responses={403: error("Debug login is disabled"), 422: error("Invalid username")},
)
async def login_debug(
    settings: SettingsDep,
    username: Annotated[str, Query(min_length=1, max_length=64, pattern=_USERNAME)],
) -> RedirectResponse:
    """Redirect to the debug callback, like an OAuth provider would (development only)."""
    if not settings.allow_debug_auth:
        raise NotPermitted("debug_auth_disabled", "debug login is disabled on this server")
    return RedirectResponse(f"/auth/callback/debug?code={username}")


@router.get(
    "/callback/debug",
    response_model=LoginResponse,
    responses={403: error("Debug login is disabled"), 422: error("Invalid username")},
)
async def debug_login(
    settings: SettingsDep,
    session: SessionDep,
    code: Annotated[str, Query(min_length=1, max_length=64, pattern=_USERNAME)],
) -> LoginResponse:
    """Log in as ``code`` without a password (development only: ``OASST_SERVER_ALLOW_DEBUG_AUTH``)."""
    if not settings.allow_debug_auth:
        raise NotPermitted("debug_auth_disabled", "debug login is disabled on this server")
    user = await get_or_create_user(session, "debug", code, code)
    return await refresh_tokens.login(session, settings, user)


@router.get(
    "/login/{provider}",
    status_code=302,
    response_class=RedirectResponse,
    responses={404: error("The provider is not configured")},
)
async def login_oauth(
    provider: str,
    settings: SettingsDep,
    web: Annotated[bool, Query(description="Started by the web chat page: finish on the page")] = False,
) -> RedirectResponse:
    """Start signing in with ``github`` or ``discord``: redirects to the provider."""
    config = oauth.get_provider(settings, provider)
    state, nonce = oauth.new_state(settings, config, web=web)
    response = RedirectResponse(await oauth.authorization_url(settings, config, state), status_code=302)
    response.set_cookie(
        oauth.STATE_COOKIE,
        nonce,
        max_age=settings.oauth_state_ttl_seconds,
        httponly=True,
        samesite="lax",
        secure=settings.api_root.startswith("https://"),
        path="/auth/callback",
    )
    return response


@router.get(
    "/callback/{provider}",
    response_model=LoginResponse,
    responses={
        400: error("Bad or expired state, a sign-in started elsewhere, or the provider refused the code"),
        404: error("The provider is not configured"),
        502: error("The provider could not be reached or answered unexpectedly"),
    },
)
async def callback_oauth(
    provider: str,
    settings: SettingsDep,
    session: SessionDep,
    code: Annotated[str, Query(min_length=1, max_length=2048)],
    state: Annotated[str, Query(min_length=1, max_length=4096)],
    nonce: Annotated[str | None, Cookie(alias=oauth.STATE_COOKIE)] = None,
) -> Response:
    """Where the provider sends the browser back: signs the user in and returns the tokens (to the
    web chat page, when it started the sign-in, as a page that stores them and opens the chat)."""
    web = oauth.started_by_web_page(state)
    try:
        config = oauth.get_provider(settings, provider)
        oauth.check_state(settings, config, state, nonce)
        account_id, name = await oauth.fetch_identity(settings, config, code)
        user = await get_or_create_user(session, config.name, account_id, name)
        if user.deleted:
            raise NotAuthenticated("user_deleted", "this account was deleted")
        pair = await refresh_tokens.login(session, settings, user)
    except DomainError as exc:
        if web:
            return signin_handoff(error=exc.detail)
        raise
    response: Response = (
        signin_handoff(pair) if web else Response(pair.model_dump_json(), media_type="application/json")
    )
    response.delete_cookie(oauth.STATE_COOKIE, path="/auth/callback")
    return response
