"""Worker trust through the admin API: trusting a key, the compliance-check history, the flag threshold
and clearing a flag."""

from __future__ import annotations

import uuid

from oasst_inference_server.workers.compliance_store import FAILED, INCONCLUSIVE, PASSED, CheckResult
from tests.support.api import ADMIN, API, assert_error

pytestmark = API


def _check(worker_id: str | None, session_id: str, outcome: str, detail: str = "") -> CheckResult:
    return CheckResult(
        worker_id=worker_id,
        session_id=session_id,
        model_config_name="trust-model",
        kind="output",
        outcome=outcome,
        detail=detail or outcome,
        reference_session_id="ws-trusted",
        prompt="Why is the sky blue?",
        expected_text=" Rayleigh scattering",
        actual_text=" Because it is" if outcome == FAILED else " Rayleigh scattering",
    )


async def test_new_keys_are_untrusted_and_an_admin_trusts_them(client):
    worker = (await client.post("/admin/workers", json={"name": "trust-me"}, headers=ADMIN)).json()
    assert worker["trusted"] is False and worker["flagged_at"] is None
    trusted = await client.put(f"/admin/workers/{worker['id']}/trust", json={"trusted": True}, headers=ADMIN)
    assert trusted.status_code == 200 and trusted.json()["trusted"] is True
    listed = (await client.get("/admin/workers", headers=ADMIN)).json()
    assert next(w for w in listed if w["id"] == worker["id"])["trusted"] is True
    assert_error(
        await client.put("/admin/workers/nope/trust", json={"trusted": True}, headers=ADMIN),
        404,
        "worker_not_found",
    )
    assert_error(await client.put(f"/admin/workers/{worker['id']}/trust", json={}, headers=ADMIN), 422)


async def test_failed_checks_past_the_threshold_flag_the_key_and_operators_see_why(client, app):
    recorder = app.state.compliance
    threshold = app.state.settings.compliance_fail_threshold
    worker = (await client.post("/admin/workers", json={"name": "checked"}, headers=ADMIN)).json()
    session_id = f"ws-checked-{uuid.uuid4().hex[:8]}"
    # Passed and inconclusive checks (a slow or briefly down worker) never count.
    for _ in range(5):
        assert not await recorder.record(_check(worker["id"], session_id, PASSED))
        assert not await recorder.record(
            _check(worker["id"], session_id, INCONCLUSIVE, "no answer within 120s")
        )
    for i in range(threshold - 1):
        assert not await recorder.record(_check(worker["id"], session_id, FAILED, f"mismatch {i}"))
    read = await client.get("/admin/workers", headers=ADMIN)
    assert next(w for w in read.json() if w["id"] == worker["id"])["flagged_at"] is None
    assert await recorder.record(_check(worker["id"], session_id, FAILED, "the last mismatch"))
    mine = next(
        w for w in (await client.get("/admin/workers", headers=ADMIN)).json() if w["id"] == worker["id"]
    )
    assert mine["flagged_at"] is not None
    assert (
        f"{threshold} failed compliance checks" in mine["flag_reason"]
        and "the last mismatch" in mine["flag_reason"]
    )

    history = (
        await client.get("/admin/compliance_checks", params={"worker_id": worker["id"]}, headers=ADMIN)
    ).json()
    assert len(history) == 10 + threshold
    failures = (
        await client.get(
            "/admin/compliance_checks", params={"worker_id": worker["id"], "outcome": "failed"}, headers=ADMIN
        )
    ).json()
    last = failures[0]
    assert len(failures) == threshold and last["detail"] == "the last mismatch"
    assert (last["expected_text"], last["actual_text"]) == (" Rayleigh scattering", " Because it is")
    assert last["session_id"] == session_id and last["reference_session_id"] == "ws-trusted"
    assert last["prompt"] == "Why is the sky blue?" and last["kind"] == "output"
    assert_error(await client.get("/admin/compliance_checks", params={"outcome": "bad"}, headers=ADMIN), 422)

    # Clearing the flag starts the count again: older failures do not count toward a new flag.
    cleared = await client.put(
        f"/admin/workers/{worker['id']}/trust", json={"trusted": False, "clear_flag": True}, headers=ADMIN
    )
    assert cleared.json()["flagged_at"] is None and cleared.json()["flag_reason"] is None
    assert not await recorder.record(_check(worker["id"], session_id, FAILED))


async def test_a_static_key_is_counted_per_socket(app):
    recorder = app.state.compliance
    threshold = app.state.settings.compliance_fail_threshold
    session_id = f"ws-static-{uuid.uuid4().hex[:8]}"
    flagged = [await recorder.record(_check(None, session_id, FAILED)) for _ in range(threshold)]
    assert flagged == [False] * (threshold - 1) + [True]
    other = f"ws-static-{uuid.uuid4().hex[:8]}"
    assert not await recorder.record(_check(None, other, FAILED))
