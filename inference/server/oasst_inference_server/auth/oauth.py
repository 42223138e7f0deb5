"""OAuth sign-in with GitHub and Discord (authorization-code flow, through authlib's httpx client).

``/auth/login/{provider}`` redirects the browser to the provider with a ``state`` that is a signed,
short-lived JWT naming the provider and a random nonce; the same nonce goes into an HttpOnly cookie.
``/auth/callback/{provider}`` accepts the code only if the state's signature, provider and expiry
hold and its nonce matches the cookie (login CSRF), then exchanges the code, reads the user's id
and name from the provider's API, and signs the user in. The state carries everything, so any
replica can serve the callback.

Provider URLs come from settings, so tests (and GitHub Enterprise) can point them elsewhere.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

import httpx
import jwt
from authlib.integrations.httpx_client import AsyncOAuth2Client, OAuthError
from loguru import logger

from oasst_inference_server.domain_errors import InvalidRequest, NotFound, UpstreamFailed
from oasst_inference_server.settings import Settings

try:  # authlib uses httpx2 when it is installed (the openai SDK brings it), httpx otherwise
    import httpx2

    _TRANSPORT_ERRORS: tuple[type[Exception], ...] = (httpx.HTTPError, httpx2.HTTPError)
except ImportError:  # pragma: no cover - depends on the environment
    _TRANSPORT_ERRORS = (httpx.HTTPError,)

_EXCHANGE_ERRORS: tuple[type[Exception], ...] = (*_TRANSPORT_ERRORS, ValueError)
STATE_COOKIE = "oasst_oauth_nonce"
_STATE_KIND = "oauth_state"
_TIMEOUT = 15.0  # seconds (authlib takes a number, not an httpx.Timeout)


@dataclass(frozen=True)
class OAuthProvider:
    name: str
    client_id: str
    client_secret: str
    authorize_url: str
    token_url: str
    api_base_url: str
    scope: str
    userinfo_path: str
    id_field: str
    name_field: str

    def userinfo_url(self) -> str:
        return self.api_base_url.rstrip("/") + "/" + self.userinfo_path


# What differs between the providers besides their settings: scope, user endpoint and its fields.
_PROVIDER_DETAILS: dict[str, dict[str, str]] = {
    "github": {"scope": "read:user", "userinfo_path": "user", "id_field": "id", "name_field": "login"},
    "discord": {
        "scope": "identify",
        "userinfo_path": "users/@me",
        "id_field": "id",
        "name_field": "username",
    },
}


def configured_providers(settings: Settings) -> dict[str, OAuthProvider]:
    """The providers with a client id and secret in the settings (``auth_<name>_...``)."""
    providers: dict[str, OAuthProvider] = {}
    for name, details in _PROVIDER_DETAILS.items():
        client_id = getattr(settings, f"auth_{name}_client_id")
        client_secret = getattr(settings, f"auth_{name}_client_secret")
        if client_id and client_secret:
            providers[name] = OAuthProvider(
                name=name,
                client_id=client_id,
                client_secret=client_secret,
                authorize_url=getattr(settings, f"auth_{name}_authorize_url"),
                token_url=getattr(settings, f"auth_{name}_token_url"),
                api_base_url=getattr(settings, f"auth_{name}_api_base_url"),
                **details,
            )
    return providers


def get_provider(settings: Settings, name: str) -> OAuthProvider:
    provider = configured_providers(settings).get(name)
    if provider is None:
        raise NotFound("unknown_provider", f"sign-in with {name!r} is not configured on this server")
    return provider


def callback_url(settings: Settings, provider: OAuthProvider) -> str:
    return f"{settings.api_root.rstrip('/')}/auth/callback/{provider.name}"


def new_state(settings: Settings, provider: OAuthProvider, *, web: bool = False) -> tuple[str, str]:
    """(state for the provider, nonce for the browser's cookie). ``web``: the web chat page started
    the sign-in, so the callback hands the tokens to the page instead of answering JSON."""
    nonce = secrets.token_urlsafe(24)
    now = datetime.now(timezone.utc)
    claims = {
        "kind": _STATE_KIND,
        "provider": provider.name,
        "nonce": nonce,
        "web": web,
        "iat": now,
        "exp": now + timedelta(seconds=settings.oauth_state_ttl_seconds),
    }
    return jwt.encode(claims, settings.auth_secret, algorithm="HS256"), nonce


def started_by_web_page(state: str) -> bool:
    """Whether ``state`` says the web page started the sign-in, read without verifying it: this only
    chooses how an error is shown (a page rather than JSON), it grants nothing."""
    try:
        claims = jwt.decode(state, options={"verify_signature": False, "verify_exp": False})
    except jwt.InvalidTokenError:
        return False
    return isinstance(claims, dict) and claims.get("web") is True


def check_state(settings: Settings, provider: OAuthProvider, state: str, cookie_nonce: str | None) -> None:
    try:
        claims = jwt.decode(state, settings.auth_secret, algorithms=["HS256"], options={"require": ["exp"]})
    except jwt.ExpiredSignatureError:
        raise InvalidRequest("oauth_state_expired", "the sign-in took too long: start again") from None
    except jwt.InvalidTokenError:
        raise InvalidRequest("oauth_state_invalid", "invalid OAuth state") from None
    if claims.get("kind") != _STATE_KIND or claims.get("provider") != provider.name:
        raise InvalidRequest("oauth_state_invalid", "invalid OAuth state")
    nonce = claims.get("nonce")
    if (
        not cookie_nonce
        or not isinstance(nonce, str)
        or not secrets.compare_digest(nonce.encode(), cookie_nonce.encode())
    ):
        raise InvalidRequest("oauth_state_mismatch", "this sign-in was not started in this browser")


def _client(settings: Settings, provider: OAuthProvider) -> AsyncOAuth2Client:
    return AsyncOAuth2Client(
        client_id=provider.client_id,
        client_secret=provider.client_secret,
        scope=provider.scope,
        redirect_uri=callback_url(settings, provider),
        timeout=_TIMEOUT,
    )


async def authorization_url(settings: Settings, provider: OAuthProvider, state: str) -> str:
    async with _client(settings, provider) as client:
        url, _ = client.create_authorization_url(provider.authorize_url, state=state)
    return str(url)


async def fetch_identity(settings: Settings, provider: OAuthProvider, code: str) -> tuple[str, str]:
    """Exchange ``code`` and return the user's (account id, display name) at the provider."""
    try:
        async with _client(settings, provider) as client:
            await client.fetch_token(provider.token_url, code=code)
            response = await client.get(provider.userinfo_url())
    except OAuthError as exc:
        logger.info("{} refused an OAuth code: {}", provider.name, exc)
        raise InvalidRequest("oauth_error", f"{provider.name} refused the sign-in: {exc.error}") from None
    except _EXCHANGE_ERRORS as exc:
        logger.warning("{} OAuth exchange failed: {}", provider.name, exc)
        raise UpstreamFailed(
            "oauth_provider_error", f"could not reach {provider.name}: {type(exc).__name__}"
        ) from None
    if response.status_code != 200:
        raise UpstreamFailed(
            "oauth_provider_error", f"{provider.name} answered {response.status_code} for the user"
        )
    try:
        data: Any = response.json()
        account_id = str(data[provider.id_field])
        name = str(data.get(provider.name_field) or account_id)
    except (ValueError, KeyError, TypeError, AttributeError):
        raise UpstreamFailed("oauth_provider_error", f"unexpected user info from {provider.name}") from None
    if not account_id or len(account_id) > 128:
        raise UpstreamFailed("oauth_provider_error", f"unexpected user id from {provider.name}")
    return account_id, name[:256]
