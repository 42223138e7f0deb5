"""A fake OAuth provider (GitHub- and Discord-shaped) served on loopback in a thread.

It checks what the real providers check: the client id and secret, that a code is used once and
with the redirect URI it was issued for, and the bearer token on the user endpoint. Tests choose
the identity the next sign-in gets with ``next_identity``.
"""

from __future__ import annotations

import base64
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlencode

import uvicorn
from fastapi import FastAPI, Header, Request
from fastapi.responses import JSONResponse, RedirectResponse

CLIENT_ID = "fake-client-id"
CLIENT_SECRET = "fake-client-secret-0123456789"


@dataclass
class FakeProvider:
    url: str = ""
    identities: dict[str, dict[str, Any]] = field(default_factory=dict)  # code -> identity
    tokens: dict[str, dict[str, Any]] = field(default_factory=dict)  # access token -> identity
    redirects: dict[str, str] = field(default_factory=dict)  # code -> redirect_uri
    next_identity: dict[str, Any] = field(default_factory=lambda: {"id": 1, "login": "octocat"})
    token_requests: int = 0
    discord_grant_types: list[str | None] = field(default_factory=list)

    def app(self) -> FastAPI:
        app = FastAPI()

        def authorize(request: Request) -> RedirectResponse:
            params = request.query_params
            assert params["client_id"] == CLIENT_ID and params["response_type"] == "code"
            code = secrets.token_hex(8)
            self.identities[code] = dict(self.next_identity)
            self.redirects[code] = params["redirect_uri"]
            query = urlencode({"code": code, "state": params["state"]})
            return RedirectResponse(f"{params['redirect_uri']}?{query}", status_code=302)

        def exchange(data: dict[str, str], basic: str | None):
            """A token request (form ``data``, the ``Authorization`` header): (body, None) or (None, error)."""
            self.token_requests += 1
            code, redirect_uri = data.get("code", ""), data.get("redirect_uri")
            client = (data.get("client_id"), data.get("client_secret"))
            if basic and basic.lower().startswith("basic "):
                client = tuple(base64.b64decode(basic[6:]).decode().split(":", 1))  # type: ignore[assignment]
            if client != (CLIENT_ID, CLIENT_SECRET):
                return None, "invalid_client"
            identity = self.identities.pop(code, None)
            if identity is None or self.redirects.pop(code, None) != redirect_uri:
                return None, "invalid_grant"
            token = secrets.token_hex(12)
            self.tokens[token] = identity
            return {"access_token": token, "token_type": "bearer", "scope": "x"}, None

        def user_of(authorization: str | None) -> dict[str, Any] | None:
            if not authorization or not authorization.startswith("Bearer "):
                return None
            return self.tokens.get(authorization[7:])

        app.get("/github/login/oauth/authorize")(authorize)
        app.get("/discord/api/oauth2/authorize")(authorize)

        async def form(request: Request) -> dict[str, str]:
            return {k: v[0] for k, v in parse_qs((await request.body()).decode()).items()}

        @app.post("/github/login/oauth/access_token")
        async def github_token(request: Request):
            body, err = exchange(await form(request), request.headers.get("authorization"))
            # GitHub answers 200 with an error field.
            return body or {"error": "bad_verification_code" if err == "invalid_grant" else err}

        @app.post("/discord/api/oauth2/token")
        async def discord_token(request: Request):
            data = await form(request)
            self.discord_grant_types.append(data.get("grant_type"))
            if data.get("grant_type") != "authorization_code":
                return JSONResponse({"error": "unsupported_grant_type"}, status_code=400)
            body, err = exchange(data, request.headers.get("authorization"))
            return body or JSONResponse({"error": err}, status_code=400)

        @app.get("/github/api/user")
        async def github_user(authorization: str | None = Header(default=None)):
            identity = user_of(authorization)
            return identity or JSONResponse({"message": "Bad credentials"}, status_code=401)

        @app.get("/discord/api/users/@me")
        async def discord_user(authorization: str | None = Header(default=None)):
            identity = user_of(authorization)
            return identity or JSONResponse({"message": "401: Unauthorized"}, status_code=401)

        return app


class ServerThread:
    """uvicorn serving an ASGI app on a free loopback port in a daemon thread."""

    def __init__(self, app: Any, port: int):
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the fake OAuth provider did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *_: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
