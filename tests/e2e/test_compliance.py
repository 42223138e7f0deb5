"""Compliance checks end to end, on the real bundled CPU backend.

One trusted worker (a static trusted key) and two untrusted ones (admin-created keys), all on one CPU
backend: the honest one talks to it directly, the dishonest one through a proxy that changes one
streamed token in five. Checks come every fraction of a second. The dishonest worker is flagged within
the threshold of failed checks and gets no more user work; the honest one passes every check of a run
of at least 50; user answers in flight when the worker is flagged are all completed.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from oasst_cpu_backend.settings import default_model_path
from tests.support.altering_proxy import AlteringProxy
from tests.support.api import ADMIN_TOKEN
from tests.support.fake_oauth import ServerThread
from tests.support.fault_flows import new_api, queue, wait_state
from tests.support.processes import free_port, start_process, wait_for_model, wait_started
from tests.support.services import fresh_database
from tests.support.stacks import MODEL_NAME, BackendProcess, Stack, start_stack

pytestmark = pytest.mark.slow

TRUSTED_KEY = "trusted-worker-key-0123456789"
THRESHOLD = 3
HONEST_CHECKS = 50
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


@pytest.fixture(scope="module")
def compliance_stack(
    cpu_backend: BackendProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    log_dir = tmp_path_factory.mktemp("compliance-stack")
    with fresh_database("oasst_compliance") as database_url:
        stack = start_stack(
            log_dir,
            cpu_backend.url,
            database_url,
            None,
            workers=0,
            OASST_SERVER_ADMIN_ROOT_TOKEN=ADMIN_TOKEN,
            OASST_SERVER_TRUSTED_WORKER_API_KEYS=f'["{TRUSTED_KEY}"]',
            OASST_SERVER_COMPLIANCE_CHECK_INTERVAL="0.3",
            OASST_SERVER_COMPLIANCE_CHECK_MAX_NEW_TOKENS="12",
            OASST_SERVER_COMPLIANCE_FAIL_THRESHOLD=str(THRESHOLD),
        )
        try:
            yield stack
        finally:
            stack.stop()


def _admin(stack: Stack, method: str, path: str, **kwargs) -> httpx.Response:
    response = httpx.request(method, f"{stack.url}{path}", headers=ADMIN, timeout=30, **kwargs)
    response.raise_for_status()
    return response


def _checks(stack: Stack, worker_id: str) -> list[dict]:
    return _admin(
        stack, "GET", "/admin/compliance_checks", params={"worker_id": worker_id, "limit": 500}
    ).json()


def _worker(stack: Stack, worker_id: str) -> dict:
    return next(w for w in _admin(stack, "GET", "/admin/workers").json() if w["id"] == worker_id)


@contextlib.contextmanager
def _own_workers(stack: Stack) -> Iterator[None]:
    """Stops the workers a test started (their checks would slow the next test)."""
    before = len(stack.workers)
    try:
        yield
    finally:
        for worker in stack.workers[before:]:
            worker.stop()
        del stack.workers[before:]


def _tampered_model(directory: Path) -> Path:
    """A copy of the bundled GGUF with part of its weights changed: another model file, which loads."""
    source = default_model_path()
    target = directory / "SmolLM2-135M-Instruct.tampered.gguf"
    data = bytearray(source.read_bytes())
    start, end = len(data) // 2, len(data) // 2 + len(data) // 20
    for i in range(start, end, 3):
        data[i] ^= 0x11
    target.write_bytes(bytes(data))
    return target


def _wait(condition, timeout: float, what: str):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_worker_that_alters_its_output_is_flagged_and_an_honest_one_never(compliance_stack, cpu_backend):
    stack = compliance_stack
    honest = _admin(stack, "POST", "/admin/workers", json={"name": "honest"}).json()
    liar = _admin(stack, "POST", "/admin/workers", json={"name": "liar"}).json()
    assert not honest["trusted"] and not liar["trusted"]
    proxy = AlteringProxy(cpu_backend.url, every=5)
    port = free_port()
    with ServerThread(proxy.app(), port), _own_workers(stack):
        stack.start_worker(OASST_WORKER_API_KEY=TRUSTED_KEY)
        wait_for_model(stack.url, MODEL_NAME)
        stack.start_worker(OASST_WORKER_API_KEY=honest["api_key"], OASST_WORKER_MAX_PARALLEL_REQUESTS="2")
        stack.start_worker(
            backend_url=f"http://127.0.0.1:{port}",
            OASST_WORKER_API_KEY=liar["api_key"],
            OASST_WORKER_MAX_PARALLEL_REQUESTS="2",
        )
        sessions = _wait(
            lambda: (
                [s for s in _admin(stack, "GET", "/admin/worker_sessions").json() if s["worker_id"]]
                if len([s for s in _admin(stack, "GET", "/admin/worker_sessions").json() if s["worker_id"]])
                == 2
                else None
            ),
            60,
            "the untrusted workers",
        )
        # Every worker reports the backend's identity; the proxy passes it through unchanged.
        for session in sessions:
            assert session["backend_model_id"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
            assert session["backend_model_revision"].startswith("sha256:")
            assert session["trusted"] is False
        # User work in flight on every worker while the checks run.
        users = [new_api(stack) for _ in range(4)]
        in_flight = [
            queue(api, MODEL_NAME, f"Tell me a story about a {animal}.", max_new_tokens=48)
            for api, animal in zip(users, ["cat", "dog", "fox", "owl"], strict=True)
        ]

        flagged = _wait(
            lambda: _worker(stack, liar["id"])["flagged_at"] and _worker(stack, liar["id"]),
            180,
            "the dishonest worker to be flagged",
        )
        failed = [c for c in _checks(stack, liar["id"]) if c["outcome"] == "failed"]
        assert len(failed) == THRESHOLD, failed
        assert f"{THRESHOLD} failed compliance checks" in flagged["flag_reason"]
        last = failed[0]
        assert proxy.altered > 0 and "banana" in last["actual_text"] and last["expected_text"]
        assert last["expected_text"] != last["actual_text"]
        # No user answer in flight was lost when the worker was excluded.
        for api, (chat_id, message_id) in zip(users, in_flight, strict=True):
            message = wait_state(api, chat_id, message_id, {"complete", "failed", "aborted_by_worker"}, 180)
            assert message["state"] == "complete", message

        # The flagged worker gets no user work (and no more checks): its proxy sees no new token.
        liar_session = next(
            s for s in _admin(stack, "GET", "/admin/worker_sessions").json() if s["worker_id"] == liar["id"]
        )
        assert liar_session["flagged"] is True
        seen = proxy.tokens_seen
        later = [queue(api, MODEL_NAME, "What is two plus two?", max_new_tokens=8) for api in users]
        for api, (chat_id, message_id) in zip(users, later, strict=True):
            assert wait_state(api, chat_id, message_id, {"complete"}, 180)["state"] == "complete"
        assert proxy.tokens_seen == seen

        # The honest worker passes every check of a long run.
        checks = _wait(
            lambda: (
                (c := _checks(stack, honest["id"]))
                and sum(x["outcome"] == "passed" for x in c) >= HONEST_CHECKS
                and c
            ),
            600,
            f"{HONEST_CHECKS} checks of the honest worker",
        )
        assert [c for c in checks if c["outcome"] == "failed"] == []
        assert _worker(stack, honest["id"])["flagged_at"] is None
        assert len({c["prompt"] for c in checks}) > 1  # not one fixed prompt a worker could learn
        metrics = httpx.get(f"{stack.url}/metrics", timeout=10).text
        assert (
            'oasst_server_compliance_checks_total{kind="output",model="SmolLM2-135M-Instruct",outcome="failed"}'
            in metrics
        )
        assert "oasst_server_workers_flagged_total 1.0" in metrics


def test_a_worker_serving_another_model_file_is_flagged(compliance_stack, tmp_path):
    stack = compliance_stack
    other = _admin(stack, "POST", "/admin/workers", json={"name": "other-file"}).json()
    port = free_port()
    backend = start_process(
        "tampered-backend",
        "oasst_cpu_backend",
        {
            "OASST_CPU_BACKEND_HOST": "127.0.0.1",
            "OASST_CPU_BACKEND_PORT": str(port),
            "OASST_CPU_BACKEND_MODEL_PATH": str(_tampered_model(tmp_path)),
        },
        tmp_path,
    )
    try:
        wait_started(f"http://127.0.0.1:{port}/health", backend, timeout=120)
        with _own_workers(stack):
            stack.start_worker(OASST_WORKER_API_KEY=TRUSTED_KEY)
            stack.start_worker(backend_url=f"http://127.0.0.1:{port}", OASST_WORKER_API_KEY=other["api_key"])
            flagged = _wait(
                lambda: _worker(stack, other["id"])["flagged_at"] and _worker(stack, other["id"]),
                300,
                "the worker of another model file to be flagged",
            )
            assert f"{THRESHOLD} failed compliance checks" in flagged["flag_reason"]
            sessions = _admin(stack, "GET", "/admin/worker_sessions").json()
            mine = next(s for s in sessions if s["worker_id"] == other["id"])
            trusted = next(s for s in sessions if s["trusted"])
            # It reported its own file's hash: compared with the tolerance between builds, and failed.
            assert mine["backend_model_revision"] != trusted["backend_model_revision"]
            assert mine["flagged"] is True
            failed = [c for c in _checks(stack, other["id"]) if c["outcome"] == "failed"]
            assert len(failed) == THRESHOLD and "allowed between builds" in failed[0]["detail"]
    finally:
        backend.stop()
