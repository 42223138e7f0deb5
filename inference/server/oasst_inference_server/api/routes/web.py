"""The web chat page: its HTML (at ``/`` and at ``/c/{chat_id}``, the address of a chat), its static
files, the favicon, and the page that hands an OAuth sign-in over to it.

Every HTML answer carries a Content-Security-Policy that allows scripts, styles and connections to
this origin only: the page renders model output and titles through a sanitizer, and the policy is
the second wall should anything slip through (no inline script can run, no data can leave).
"""

from __future__ import annotations

import json
from pathlib import Path

from fastapi import APIRouter, FastAPI
from fastapi.responses import FileResponse, HTMLResponse
from starlette.responses import Response
from starlette.staticfiles import StaticFiles
from starlette.types import Scope

from oasst_shared.schemas import LoginResponse

STATIC_DIR = Path(__file__).resolve().parents[2] / "static"

CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'self'"
)
_PAGE_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    # The page and its modules change with the server: always revalidate (ETag), never go stale.
    "Cache-Control": "no-cache",
}

router = APIRouter(include_in_schema=False)


def _index() -> FileResponse:
    return FileResponse(STATIC_DIR / "index.html", headers=_PAGE_HEADERS)


@router.get("/")
async def web_chat() -> FileResponse:
    return _index()


@router.get("/c/{chat_id}")
async def web_chat_at(chat_id: str) -> FileResponse:
    """A chat's own address: the page reads the id from the location and loads the chat."""
    return _index()


@router.get("/manage")
async def web_admin() -> FileResponse:
    """The admin page's address: the page shows it to admin users (the admin API decides who is one)."""
    return _index()


@router.get("/favicon.ico")
async def favicon() -> FileResponse:
    return FileResponse(STATIC_DIR / "favicon.svg", media_type="image/svg+xml", headers=_PAGE_HEADERS)


class _StaticFiles(StaticFiles):
    """The page's files, with the page's headers (revalidated on every load, no type sniffing)."""

    async def get_response(self, path: str, scope: Scope) -> Response:
        response = await super().get_response(path, scope)
        response.headers.update(_PAGE_HEADERS)
        return response


def mount_static(app: FastAPI) -> None:
    app.mount("/static", _StaticFiles(directory=STATIC_DIR), name="static")


def _script_json(data: object) -> str:
    # JSON inside <script>: escape what could end the element or start markup.
    return json.dumps(data).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def signin_handoff(pair: LoginResponse | None = None, error: str | None = None) -> HTMLResponse:
    """The end of a sign-in the web page started: a page whose script stores the tokens (or shows
    the error) and returns to the chat. The tokens travel in the body, never in a URL."""
    result = {"tokens": pair.model_dump(mode="json") if pair else None, "error": error}
    html = (
        '<!doctype html><html lang="en"><head><meta charset="utf-8"><title>Signing in…</title>'
        '<link rel="icon" href="/static/favicon.svg" type="image/svg+xml">'
        f'<script type="application/json" id="signin-result">{_script_json(result)}</script>'
        '<script type="module" src="/static/js/signin-handoff.js"></script>'
        "</head><body><p>Signing in…</p></body></html>"
    )
    headers = {**_PAGE_HEADERS, "Cache-Control": "no-store"}
    return HTMLResponse(html, status_code=200 if pair else 400, headers=headers)
