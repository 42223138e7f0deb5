"""The OpenAPI document describes every REST route with its error responses in the ErrorBody shape."""

from __future__ import annotations

from tests.support.api import API

pytestmark = API

ERROR_REF = "#/components/schemas/ErrorBody"
# vLLM's routes outside /v1 answer, as vLLM does, in OpenAI's error shape.
OPENAI_SHAPED = {"/tokenize", "/detokenize", "/rerank", "/v2/rerank", "/score"}


async def test_every_route_documents_its_errors(client):
    schema = (await client.get("/openapi.json")).json()
    assert "ErrorBody" in schema["components"]["schemas"]
    missing = []
    for path, operations in schema["paths"].items():
        if path.startswith("/v1/") or path in OPENAI_SHAPED:
            continue  # the OpenAI-compatible API documents OpenAI's error shape
        for method, operation in operations.items():
            responses = operation["responses"]
            errors = {code: r for code, r in responses.items() if code[0] in "45"}
            if "500" not in errors:
                missing.append(f"{method.upper()} {path}: no 500")
            for code, response in errors.items():
                if path == "/health" and code == "503":
                    continue  # a health report (status of each dependency), not an error body
                ref = response.get("content", {}).get("application/json", {}).get("schema", {}).get("$ref")
                if ref != ERROR_REF:
                    missing.append(f"{method.upper()} {path} {code}: {ref}")
    assert not missing, "\n".join(missing)


async def test_routes_with_ids_or_auth_document_401_and_404(client):
    schema = (await client.get("/openapi.json")).json()
    gaps = []
    for path, operations in schema["paths"].items():
        if not path.startswith(("/chats", "/account", "/admin")):
            continue
        for method, operation in operations.items():
            codes = set(operation["responses"])
            if "401" not in codes:
                gaps.append(f"{method.upper()} {path}: no 401")
            if "{" in path and "404" not in codes:
                gaps.append(f"{method.upper()} {path}: no 404")
    assert not gaps, "\n".join(gaps)
