"""A client that left before its answer (``ClientGone``, raised by the serving objects) is a 499 in the
error shape of the API it called: OpenAI's under ``/v1``, Anthropic's under ``/v1/messages``."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.testclient import TestClient

from oasst_inference_server.api.error_handlers import install_error_handlers
from oasst_inference_server.openai_api.openai_service import ClientGone


def _client() -> TestClient:
    app = FastAPI()
    install_error_handlers(app)

    async def gone() -> None:
        raise ClientGone()

    for path in ("/v1/chat/completions", "/v1/messages", "/chats"):
        app.add_api_route(path, gone, methods=["POST"])
    return TestClient(app)


def test_client_gone_is_a_499_in_each_api_s_shape() -> None:
    client = _client()
    openai = client.post("/v1/chat/completions")
    assert openai.status_code == 499
    assert openai.json()["error"]["code"] == "client_closed_request"
    anthropic = client.post("/v1/messages")
    assert anthropic.status_code == 499
    assert anthropic.json()["type"] == "error"
    rest = client.post("/chats")
    assert rest.status_code == 499
    assert rest.json() == {"detail": "the client closed the connection", "code": "client_closed_request"}
