"""The domain errors and their one mapping to HTTP: every kind has a status, and the mapping keeps the
code, the detail and the parameter."""

from __future__ import annotations

import pytest

from oasst_inference_server import domain_errors as de
from oasst_inference_server.api.error_handlers import DOMAIN_STATUS, to_api_error


def _kinds(cls: type[de.DomainError]) -> list[type[de.DomainError]]:
    return [k for sub in cls.__subclasses__() for k in (sub, *_kinds(sub))]


def test_every_domain_error_has_an_http_status():
    kinds = _kinds(de.DomainError)
    assert kinds, "no domain errors found"
    missing = [k.__name__ for k in kinds if not any(issubclass(k, mapped) for mapped in DOMAIN_STATUS)]
    assert not missing, f"add these to DOMAIN_STATUS: {missing}"


@pytest.mark.parametrize(
    "error, status",
    [
        (de.InvalidRequest("invalid_cursor", "bad cursor", param="after"), 400),
        (de.InvalidValue("settings_too_large", "too large"), 422),
        (de.NotAuthenticated("user_deleted", "this account was deleted"), 401),
        (de.NotPermitted("admin_disabled", "the admin API is disabled"), 403),
        (de.not_found("chat"), 404),
        (de.Conflict("account_conflict", "taken"), 409),
        (de.UpstreamFailed("oauth_provider_error", "down"), 502),
        (de.ServiceUnavailable("model_unavailable", "no worker", param="model"), 503),
        (de.GenerationFailed("generation_failed", "the worker failed"), 500),
    ],
)
def test_the_mapping_keeps_code_detail_and_param(error, status):
    api = to_api_error(error)
    assert (api.status_code, api.code, api.detail, api.param) == (
        status,
        error.code,
        error.detail,
        error.param,
    )
    assert api.headers is None


def test_a_bearer_challenge_becomes_www_authenticate():
    api = to_api_error(de.NotAuthenticated("token_expired", "token expired", bearer=True))
    assert api.status_code == 401 and api.headers == {"WWW-Authenticate": "Bearer"}


def test_a_retry_after_becomes_the_retry_after_header():
    limited = to_api_error(de.RateLimited("rate_limited", "slow down", retry_after=7))
    assert (limited.status_code, limited.headers) == (429, {"Retry-After": "7"})
    full = to_api_error(de.ServiceUnavailable("queue_full", "full", retry_after=10))
    assert (full.status_code, full.headers) == (503, {"Retry-After": "10"})
