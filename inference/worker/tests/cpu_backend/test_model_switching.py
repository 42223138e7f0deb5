"""The CPU backend serves a model config: the quantization it asks for is made at first use and cached;
``/admin/load`` and ``/admin/unload`` change the model while it runs, falling back when a load fails."""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import gguf
import httpx
import pytest
from text_generation import Client

from oasst_cpu_backend.settings import default_model_path
from oasst_shared.model_configs import SMOLLM2_135M, SMOLLM2_135M_Q8

from .conftest import CHAT_PROMPT, RunningBackend, start_backend, stop_backend

pytestmark = pytest.mark.slow

TIMEOUT = 120
Q8 = SMOLLM2_135M_Q8.name


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("models")
    # A file whose header is fine and whose weights are cut short: planned, then refused by llama.cpp.
    weights = folder / "weights"
    weights.mkdir()
    with default_model_path().open("rb") as whole, (weights / "cut.Q4_1.gguf").open("wb") as cut:
        cut.write(whole.read(50_000_000))
    (folder / "models.yaml").write_text(
        "- name: smol-cut\n  model_id: cut\n  backend: cpu\n  model_path: weights/cut.Q4_1.gguf\n"
        "- name: on-tgi\n  model_id: org/m\n  backend: tgi\n"
    )
    return folder


def greedy(url: str) -> tuple[str, str]:
    response = Client(url, timeout=TIMEOUT).generate(CHAT_PROMPT, max_new_tokens=12, do_sample=False)
    return response.generated_text, response.details.finish_reason.value


def test_a_quantization_is_made_at_first_use_and_cached(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    answers = []
    for start in ("first", "second"):
        backend = start_backend(
            tmp_path, OASST_CPU_BACKEND_MODEL_CONFIG_NAME=Q8, OASST_CPU_BACKEND_CACHE_DIR=str(cache)
        )
        try:
            info = httpx.get(f"{backend.url}/info", timeout=TIMEOUT).json()
            assert (info["model_config_name"], info["quantization"]) == (Q8, "q8_0")
            assert info["max_total_tokens"] == SMOLLM2_135M_Q8.max_total_length
            health = httpx.get(f"{backend.url}/health", timeout=TIMEOUT).json()
            assert (health["status"], health["model"], health["quantization"]) == ("ok", Q8, "q8_0")
            text, finish = greedy(backend.url)
            assert text.strip() and finish in ("eos_token", "length")
            answers.append(text)
            log = backend.log()
        finally:
            stop_backend(backend)
        made = list(cache.glob("*.q8_0.gguf"))
        assert len(made) == 1
        if start == "first":
            assert "quantizing to q8_0: tensor 272/272" in log
            assert re.search(
                r"quantized SmolLM2-135M-Instruct\.Q4_1\.gguf to q8_0 in \S+s: 93\.8 MiB -> 13\d\.\d MiB", log
            )
        else:
            assert "quantizing to q8_0" not in log and "from the cache" in log
    # The file served is the config's type, checked with llama.cpp's own reader.
    reader = gguf.GGUFReader(made[0])
    assert {t.tensor_type.name for t in reader.tensors if len(t.shape) >= 2} == {"Q8_0"}
    assert answers[0] == answers[1]  # greedy, one build, one file


@pytest.fixture(scope="module")
def switching(registry: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningBackend]:
    logs = tmp_path_factory.mktemp("switching")
    backend = start_backend(
        logs,
        OASST_CPU_BACKEND_MODEL_CONFIG_NAME=SMOLLM2_135M.name,
        OASST_CPU_BACKEND_MODEL_CONFIGS_DIR=str(registry),
        OASST_CPU_BACKEND_CACHE_DIR=str(logs / "cache"),
    )
    try:
        yield backend
    finally:
        stop_backend(backend)


def load(backend: RunningBackend, name: str, **headers: str) -> httpx.Response:
    return httpx.post(
        f"{backend.url}/admin/load", json={"model_config_name": name}, headers=headers, timeout=TIMEOUT
    )


def test_load_unload_and_load_again(switching: RunningBackend) -> None:
    url = switching.url
    assert httpx.get(f"{url}/info", timeout=TIMEOUT).json()["quantization"] == "q4_1"
    before, _ = greedy(url)

    response = load(switching, Q8)
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["model"], body["quantization"], body["context_length"]) == (Q8, "q8_0", 2048)
    assert body["file"].endswith(".q8_0.gguf") and body["file_bytes"] > 130 * 2**20
    assert httpx.get(f"{url}/info", timeout=TIMEOUT).json()["model_config_name"] == Q8
    text, finish = greedy(url)
    assert text.strip() and finish in ("eos_token", "length")
    # Unloading came first: the log says so before the new model was loaded.
    log = switching.log()
    assert log.rindex("unloading model SmolLM2-135M-Instruct") < log.rindex(f"loading model {Q8}")

    assert httpx.post(f"{url}/admin/unload", timeout=TIMEOUT).json() == {"status": "unloaded"}
    health = httpx.get(f"{url}/health", timeout=TIMEOUT)
    assert health.status_code == 503 and health.json()["status"] == "unloaded"
    refused = httpx.post(f"{url}/generate", json={"inputs": "hi"}, timeout=TIMEOUT)
    assert refused.status_code == 503 and refused.json()["error_type"] == "overloaded"
    assert httpx.get(f"{url}/info", timeout=TIMEOUT).status_code == 503

    assert load(switching, SMOLLM2_135M.name).status_code == 200
    assert greedy(url)[0] == before


def test_a_failed_load_falls_back_to_the_previous_model(switching: RunningBackend) -> None:
    assert load(switching, SMOLLM2_135M.name).status_code == 200
    response = load(switching, "smol-cut")
    assert response.status_code == 500
    body = response.json()
    assert body["error_type"] == "load_failed" and body["fallback"] == SMOLLM2_135M.name
    assert "loading smol-cut failed" in body["error"]
    health = httpx.get(f"{switching.url}/health", timeout=TIMEOUT).json()
    assert (health["status"], health["model"]) == ("ok", SMOLLM2_135M.name)
    assert greedy(switching.url)[0].strip()


def test_refused_loads_change_nothing(switching: RunningBackend) -> None:
    assert load(switching, SMOLLM2_135M.name).status_code == 200
    unknown = load(switching, "no-such-model")
    assert unknown.status_code == 404 and "no-such-model" in unknown.json()["error"]
    wrong_backend = load(switching, "on-tgi")
    assert wrong_backend.status_code == 422 and "not the CPU backend" in wrong_backend.json()["error"]
    bad_body = httpx.post(f"{switching.url}/admin/load", json={"model_config_name": "a b"}, timeout=TIMEOUT)
    assert bad_body.status_code == 422
    assert httpx.get(f"{switching.url}/health", timeout=TIMEOUT).json()["model"] == SMOLLM2_135M.name


def test_an_admin_token_guards_the_admin_routes(tmp_path: Path) -> None:
    backend = start_backend(tmp_path, OASST_CPU_BACKEND_ADMIN_TOKEN="s3cret")
    try:
        assert load(backend, Q8).status_code == 401
        assert httpx.post(f"{backend.url}/admin/unload", timeout=TIMEOUT).status_code == 401
        assert httpx.get(f"{backend.url}/health", timeout=TIMEOUT).status_code == 200
        assert load(backend, SMOLLM2_135M.name, authorization="Bearer s3cret").status_code == 200
    finally:
        stop_backend(backend)


def test_an_unknown_config_at_start_stops_the_backend(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="model_config_name: unknown model config 'nope'"):
        start_backend(tmp_path, OASST_CPU_BACKEND_MODEL_CONFIG_NAME="nope")


def test_the_shipped_file_is_not_touched(tmp_path: Path) -> None:
    # The cache holds what is made; the source stays as it was (a copy keeps the test from racing others).
    copy = tmp_path / "m.Q4_1.gguf"
    shutil.copy(default_model_path(), copy)
    before = copy.read_bytes()
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "m.yaml").write_text(
        f"name: m\nmodel_id: m\nbackend: cpu\nmodel_path: {copy}\nquantization: q4_0\n"
    )
    backend = start_backend(
        tmp_path,
        OASST_CPU_BACKEND_MODEL_CONFIG_NAME="m",
        OASST_CPU_BACKEND_MODEL_CONFIGS_DIR=str(tmp_path / "models"),
        OASST_CPU_BACKEND_CACHE_DIR=str(tmp_path / "cache"),
    )
    try:
        assert httpx.get(f"{backend.url}/info", timeout=TIMEOUT).json()["quantization"] == "q4_0"
    finally:
        stop_backend(backend)
    assert copy.read_bytes() == before
