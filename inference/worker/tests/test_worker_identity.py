"""What the worker tells the server about its backend: model id, revision or file hash, build."""

from __future__ import annotations

from oasst_shared.model_configs import SMOLLM2_135M
from oasst_worker.backends.records import BackendInfo
from oasst_worker.backends.tgi import TgiInfo
from oasst_worker.connection.handshake import worker_info
from oasst_worker.settings import WorkerSettings


def test_tgi_info_carries_the_model_revision_and_the_build():
    info = TgiInfo.model_validate(
        {"model_id": "m/x", "model_sha": "abc123", "version": "2.4.0", "sha": "deadbeef", "other": 1}
    ).to_backend_info()
    assert info.model_id == "m/x"
    assert info.model_revision == "abc123"
    assert info.backend_version == "version 2.4.0, sha deadbeef"
    bundled = TgiInfo.model_validate(
        {"model_id": "m", "model_sha": "sha256:00", "version": "0.1.0", "llama_cpp_version": "0.3.2"}
    ).to_backend_info()
    assert bundled.backend_version == "version 0.1.0, llama.cpp 0.3.2"
    assert TgiInfo.model_validate({}).to_backend_info().backend_version is None


def test_worker_info_reports_the_backend_identity():
    settings = WorkerSettings(api_key="k" * 20)
    described = worker_info(
        settings, SMOLLM2_135M, BackendInfo(model_id="m", model_revision="r" * 300, backend_version="b")
    )
    assert described.backend_model_id == "m"
    assert described.backend_model_revision == "r" * 256  # bounded to what the protocol accepts
    assert described.backend_version == "b"
    unknown = worker_info(settings, SMOLLM2_135M)
    assert (unknown.backend_model_id, unknown.backend_model_revision, unknown.backend_version) == (
        None,
        None,
        None,
    )
