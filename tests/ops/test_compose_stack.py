"""``docker compose --profile inference-cpu --profile monitoring up``, for real, as an operator runs it.

The test starts its own Docker engine (tests/ops/docker_engine.py), builds stand-ins for the images
no registry can give us here (a debootstrap Debian for ``debian:12.11-slim``; Debian's PostgreSQL,
Redis, HAProxy and Prometheus, and a provisioning checker in Grafana's place: tests/ops/standins),
copies the working tree to a project folder as a fresh clone would have it, writes ``.env`` with
``deploy/gen-env.sh``, builds the project's images with ``docker-compose build`` (reusing the cached
llama-cpp-python wheel through ``deploy/wheels``) and starts the stack with two server replicas of two
processes each behind the load balancer. Then, through the load balancer's published port only: the
production sign-in paths (no debug login; OAuth, trusted client, admin token, API keys from the admin
CLI inside a container), the text-client chatting with an API key, a worker joining with a key the
admin CLI made, the replica that streams an answer killed mid-answer while the answer completes,
Prometheus scraping every replica, worker, backend and the balancer, and the provisioned dashboard's
queries answering. It also checks the built images: non-root, health-checked, pinned to the lock
files, and free of the secrets of the ``.env`` that was in their build context.

Progress lines (what is a stand-in, how long each phase took) go to the terminal uncaptured.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.ops import docker_engine
from tests.ops.docker_engine import Compose, DockerEngine, DockerUnavailable, Timer, log
from tests.support.clients import closing
from tests.support.processes import free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2700)]

ROOT = Path(__file__).resolve().parents[2]
PROFILES = ("inference-cpu", "monitoring", "embedding")
BUILT_SERVICES = ("server", "worker-cpu", "cpu-backend", "worker-embedding")
IMAGES = {
    "server": "oasst-inference-server",
    "worker-cpu": "oasst-inference-worker",
    "cpu-backend": "oasst-cpu-backend",
    "worker-embedding": "oasst-inference-worker-embedding",
}
LOCKS = {
    "server": "server.txt",
    "worker-cpu": "worker.txt",
    "cpu-backend": "cpu-backend.txt",
    "worker-embedding": "worker-embedding.txt",
}
STANDIN_SERVICES = {
    "postgres": "postgres",
    "redis": "redis",
    "haproxy": "lb",
    "prometheus": "prometheus",
    "grafana": "grafana",
}
MODEL = "SmolLM2-135M-Instruct"
EMBEDDING_MODEL = "all-MiniLM-L6-v2"
PROJECT = "oasst-stack-test"
IMAGE_TAG = "stacktest"
SECRET_NAMES = (
    "POSTGRES_PASSWORD",
    "OASST_SERVER_AUTH_SECRET",
    "OASST_SERVER_ADMIN_ROOT_TOKEN",
    "OASST_WORKER_API_KEY",
    "GRAFANA_ADMIN_PASSWORD",
)
# Long enough an answer (hundreds of tokens) that the kill lands while it is being generated.
STORY = "Write a very long story about a dragon who learns to bake bread, in ten chapters."


@dataclass
class Stack:
    compose: Compose
    env: dict[str, str]
    url: str
    prometheus: str
    grafana: str
    log_dir: Path
    timings: dict[str, str] = field(default_factory=dict)

    @property
    def engine(self) -> DockerEngine:
        return self.compose.engine

    def admin_cli(self, *args: str) -> str:
        """``oasst-server admin ...`` inside a server container; its standard output."""
        result = self.compose.run("exec", "-T", "--index=1", "server", "oasst-server", "admin", *args)
        return result.stdout.strip()

    def admin_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.env['OASST_SERVER_ADMIN_ROOT_TOKEN']}"}

    def lb_stats(self) -> list[dict[str, str]]:
        """HAProxy's statistics (CSV), read from inside the compose network."""
        worker = self.compose.containers("worker-cpu")[0]
        script = (
            "import sys, urllib.request; "
            "sys.stdout.write(urllib.request.urlopen('http://lb:8404/stats;csv', timeout=5).read().decode())"
        )
        text = self.engine.docker("exec", worker, "python3", "-c", script).stdout
        return list(csv.DictReader(io.StringIO(text.lstrip("# "))))

    def container_ips(self, container: str) -> set[str]:
        networks = self.compose.inspect(container)["NetworkSettings"]["Networks"]
        return {network["IPAddress"] for network in networks.values()}

    def wait_healthy(self, container: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.compose.inspect(container)["State"]
            if state.get("Health", {}).get("Status") == "healthy":
                return
            time.sleep(1)
        raise AssertionError(
            f"{container} did not become healthy:\n{self.engine.docker('logs', '--tail', '40', container, check=False).stderr}"
        )

    def chat(
        self, api_key: str, prompt: str, *extra: str, timeout: float = 240
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "oasst_text_client",
                "--server-url",
                self.url,
                "--api-key",
                api_key,
                *extra,
            ],
            input=prompt + "\n",
            capture_output=True,
            text=True,
            timeout=timeout,
        )


def copy_working_tree(target: Path) -> None:
    """The files a fresh clone would have, as they are now (uncommitted changes included)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for raw in listed:
        if not raw:
            continue
        source = ROOT / raw.decode()
        if not source.is_file():  # deleted in the working tree
            continue
        destination = target / raw.decode()
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, destination)


def reuse_llama_wheel(project: Path) -> None:
    version = re.search(r"^LLAMA_CPP_VERSION \?= (\S+)$", (ROOT / "Makefile").read_text(), re.M)
    assert version, "LLAMA_CPP_VERSION not found in the Makefile"
    wheelhouse = Path(os.environ.get("WHEELHOUSE", docker_engine.CACHE_DIR / "wheels"))
    wheels = sorted(wheelhouse.glob(f"llama_cpp_python-{version.group(1)}-*.whl"))
    if wheels:
        shutil.copy2(wheels[-1], project / "deploy" / "wheels" / wheels[-1].name)
        log(f"cpu-backend: reusing {wheels[-1]} (no llama.cpp compile)")
    else:
        log(f"cpu-backend: no cached llama-cpp-python wheel in {wheelhouse}: the image build compiles it")


def reuse_torch_wheel(project: Path) -> None:
    """torch's CPU build for the embedding image (PyPI's is the CUDA build; PyTorch's index is not
    reachable here): the wheel this machine keeps in pip's find-links folder."""
    pin = next(
        line.split("==")[1]
        for line in (ROOT / "deploy/requirements/worker-embedding.txt").read_text().splitlines()
        if line.startswith("torch==")
    )
    folders = [Path(p) for p in os.environ.get("PIP_FIND_LINKS", "/opt/wheels").split()] + [
        Path("/opt/wheels")
    ]
    wheels = sorted(w for folder in folders for w in folder.glob(f"torch-{pin}-cp311-*.whl"))
    assert wheels, f"no torch {pin} wheel in {folders}: the embedding image needs one (or TORCH_INDEX_URL)"
    shutil.copy2(wheels[0], project / "deploy" / "wheels" / wheels[0].name)
    log(f"worker-embedding: torch from {wheels[0]}")


def write_env(project: Path, lb_port: int, prometheus_port: int, grafana_port: int) -> dict[str, str]:
    overrides = {
        "OASST_PUBLISHED_PORT": str(lb_port),
        "PROMETHEUS_PUBLISHED_PORT": str(prometheus_port),
        "GRAFANA_PUBLISHED_PORT": str(grafana_port),
        "OASST_SERVER_API_ROOT": f"http://127.0.0.1:{lb_port}",
        "OASST_SERVER_PROCESSES": "2",
        "OASST_SERVER_REPLICAS": "2",
        "OASST_SERVER_AUTH_GITHUB_CLIENT_ID": "stack-test-github-client",
        "OASST_SERVER_AUTH_GITHUB_CLIENT_SECRET": uuid.uuid4().hex,
        "OASST_SERVER_TRUSTED_CLIENT_API_KEYS": json.dumps([uuid.uuid4().hex]),
        "OASST_IMAGE_TAG": IMAGE_TAG,
        "TORCH_INDEX_URL": "",  # not reachable here: torch comes from deploy/wheels
    }
    # gen-env.sh writes any template variable set in its environment: nothing of the developer's
    # shell may leak into the .env, so it gets these alone.
    subprocess.run(
        [str(project / "deploy" / "gen-env.sh"), str(project / ".env")],
        env={"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root"), **overrides},
        check=True,
        capture_output=True,
    )
    values = {}
    for line in (project / ".env").read_text().splitlines():
        if "=" in line and not line.startswith("#"):
            name, _, value = line.partition("=")
            values[name] = value
    return values


def wait_for_model(url: str, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = httpx.get(f"{url}/configs/model_configs", timeout=5)
            if last.status_code == 200 and any(m["name"] == MODEL for m in last.json()):
                return
        except httpx.HTTPError as exc:
            last = exc
        time.sleep(1)
    raise AssertionError(f"no worker for {MODEL} behind the load balancer at {url}: {last}")


@pytest.fixture(scope="module")
def stack(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    terminal = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if terminal is not None and capture is not None:

        def report(line: str) -> None:
            with capture.global_and_fixture_disabled():
                terminal.write_line(line)

        docker_engine.set_reporter(report)
    total = Timer.now()
    timings: dict[str, str] = {}
    engine = DockerEngine()
    try:
        try:
            engine.start()
        except DockerUnavailable as exc:
            pytest.fail(f"Docker cannot run here: {exc}")
        timer = Timer.now()
        docker_engine.ensure_base_image(engine)
        compose_file = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
        tags = {
            name: compose_file["services"][service]["image"] for name, service in STANDIN_SERVICES.items()
        }
        docker_engine.build_standins(engine, tags)
        timings["base image and stand-ins"] = str(timer)

        project = tmp_path_factory.mktemp("compose-project")
        log_dir = tmp_path_factory.mktemp("compose-logs")
        copy_working_tree(project)
        reuse_llama_wheel(project)
        reuse_torch_wheel(project)
        lb_port, prometheus_port, grafana_port = free_port(), free_port(), free_port()
        env = write_env(project, lb_port, prometheus_port, grafana_port)
        compose = Compose(engine, project, PROJECT, PROFILES)
        compose.run("down", "--volumes", "--remove-orphans", check=False)

        timer = Timer.now()
        docker_engine.build_project_images(compose, BUILT_SERVICES, log_dir)
        timings["project images"] = str(timer)

        timer = Timer.now()
        try:
            compose.run("up", "-d")
            url = f"http://127.0.0.1:{lb_port}"
            wait_for_model(url)
        except (RuntimeError, AssertionError) as exc:
            raise AssertionError(f"{exc}\n\ncompose logs:\n{compose.logs()}") from exc
        timings["stack up"] = str(timer)
        log(f"stack up: load balancer {url}, {len(compose.containers('server'))} server replicas")
        stack = Stack(
            compose=compose,
            env=env,
            url=url,
            prometheus=f"http://127.0.0.1:{prometheus_port}",
            grafana=f"http://127.0.0.1:{grafana_port}",
            log_dir=log_dir,
            timings=timings,
        )
        try:
            yield stack
        finally:
            (log_dir / "compose.log").write_text(compose.logs(tail=400))
            compose.run("down", "--volumes", "--remove-orphans", check=False)
            # Images that a rebuild replaced; the tagged images and build stages stay as the cache.
            engine.docker("image", "prune", "-f", check=False)
    finally:
        engine.stop()
        timings["total"] = str(total)
        log("timings: " + ", ".join(f"{k} {v}" for k, v in timings.items()))


# ---------------------------------------------------------------- the images


def image_of(service: str) -> str:
    return f"{IMAGES[service]}:{IMAGE_TAG}"


def test_the_images_run_as_a_user_with_health_checks_and_pinned_packages(stack: Stack) -> None:
    sizes = []
    for service in BUILT_SERVICES:
        image = image_of(service)
        config = json.loads(stack.engine.docker("image", "inspect", image).stdout)[0]
        assert config["Config"]["User"] == "10001", image
        assert config["Config"]["Healthcheck"]["Test"][0] == "CMD", image
        sizes.append(f"{image} {config['Size'] / 1e6:.0f} MB")
        frozen = stack.engine.docker(
            "run", "--rm", "--entrypoint", "python3", image, "-m", "pip", "freeze"
        ).stdout
        lock = {
            line.split("==")[0].lower().replace("_", "-"): line.split("==")[1]
            for name in ("build.txt", LOCKS[service])
            for line in (ROOT / "deploy" / "requirements" / name).read_text().splitlines()
            if "==" in line and not line.startswith("#")
        }
        installed = dict(line.split("==", 1) for line in frozen.splitlines() if "==" in line)
        assert installed, frozen
        for name, version in installed.items():
            key = name.lower().replace("_", "-")
            if key in ("oasst-shared", "oasst-inference-server", "oasst-inference-worker"):
                continue
            if key == "llama-cpp-python":
                assert (
                    version == re.search(r"LLAMA_CPP_VERSION \?= (\S+)", (ROOT / "Makefile").read_text())[1]
                )
                continue
            assert lock.get(key) == version, f"{image}: {name}=={version} is not in deploy/requirements"
    log("image sizes: " + ", ".join(sizes))


def test_no_secret_of_the_env_file_reaches_an_image(stack: Stack) -> None:
    """The .env with the secrets sat in the build context; no image may hold it or any of them."""
    assert (stack.compose.project_dir / ".env").is_file()
    secrets = [stack.env[name].encode() for name in SECRET_NAMES]
    assert all(len(s) >= 32 for s in secrets)
    for service in BUILT_SERVICES:
        container = stack.engine.docker("create", image_of(service)).stdout.strip()
        try:
            exported = subprocess.run(
                ["docker", "export", container], env=stack.engine.env, capture_output=True, check=True
            ).stdout
        finally:
            stack.engine.docker("rm", container, check=False)
        names = tarfile.open(fileobj=io.BytesIO(exported)).getnames()
        assert not [n for n in names if Path(n).name.startswith(".env")], service
        assert not [s for s in secrets if s in exported], f"a secret of .env is inside {service}'s image"


# ---------------------------------------------------------------- sign-in in production


def test_production_sign_in_without_the_development_login(stack: Stack) -> None:
    client = closing(httpx.Client(base_url=stack.url, timeout=30))
    # No debug login: only the configured OAuth provider is offered.
    assert client.get("/auth/providers").json() == ["github"]
    debug = client.get("/auth/login/debug", params={"username": "mallory"})
    assert debug.status_code == 403 and debug.json()["code"] == "debug_auth_disabled"
    # OAuth: the browser is sent to GitHub with this deployment's public callback URL.
    github = client.get("/auth/login/github")
    assert github.status_code == 302
    location = httpx.URL(github.headers["location"])
    assert location.host == "github.com"
    assert location.params["client_id"] == stack.env["OASST_SERVER_AUTH_GITHUB_CLIENT_ID"]
    assert location.params["redirect_uri"] == f"{stack.env['OASST_SERVER_API_ROOT']}/auth/callback/github"

    # A trusted frontend signs its user in with its key from the .env.
    from oasst_inference_server.auth.trusted_client import TrustedClient, encode_trusted_client

    trusted_key = json.loads(stack.env["OASST_SERVER_TRUSTED_CLIENT_API_KEYS"])[0]
    header = encode_trusted_client(
        TrustedClient(
            api_key=trusted_key,
            client="website",
            user_id=str(uuid.uuid4()),
            provider_account_id="42",
            username="web-user",
        )
    )
    assert client.post("/auth/trusted", headers={"TrustedClient": header}).status_code == 200
    assert client.post("/chats", json={}, headers={"TrustedClient": header}).status_code == 200
    forged = encode_trusted_client(
        TrustedClient(
            api_key="not-the-key-of-any-client",
            client="website",
            user_id="x",
            provider_account_id="1",
            username="x",
        )
    )
    assert client.post("/auth/trusted", headers={"TrustedClient": forged}).status_code == 401

    # The admin API answers the root token of the .env, and nothing else.
    assert client.get("/admin/workers", headers=stack.admin_headers()).status_code == 200
    assert client.get("/admin/workers", headers={"Authorization": "Bearer " + "x" * 40}).status_code == 403

    # An API key made by the admin CLI inside a server container signs its user in.
    key = stack.admin_cli("create-api-key", "--user", "alice")
    assert key.startswith("oak-"), key
    bearer = {"Authorization": f"Bearer {key}"}
    assert client.get("/auth/check", headers=bearer).json()["display_name"] == "alice"
    assert client.get("/api_keys", headers=bearer).status_code == 401  # a key cannot manage keys


def test_the_web_chat_page_and_everything_it_loads_come_from_the_image(stack: Stack) -> None:
    """The page and its local assets are served by the server image (package data installed without
    an editable checkout), through the load balancer."""
    page = httpx.get(f"{stack.url}/", timeout=30)
    assert page.status_code == 200 and "<html" in page.text.lower()
    local = re.findall(r'(?:src|href)="(?!https?:|data:|#|mailto:|//)([^"]+)"', page.text)
    for path in set(local):
        url = httpx.URL(f"{stack.url}/").join(path)
        assert httpx.get(url, timeout=30).status_code == 200, path


def test_the_text_client_chats_through_the_load_balancer(stack: Stack) -> None:
    key = stack.admin_cli("create-api-key", "--user", "bob")
    result = stack.chat(key, "Say hello in five words.", "--greedy", "--max-new-tokens", "24", "--buffer")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip(), result.stderr
    refused = stack.chat("oak-" + "x" * 43, "Hello")
    assert refused.returncode == 1 and "refused the API key" in refused.stderr

    # Two replicas, each running two server processes (OASST_SERVER_PROCESSES=2 in the .env).
    replicas = stack.compose.containers("server")
    assert len(replicas) == 2, replicas
    for replica in replicas:
        processes = stack.engine.docker("top", replica, "-eo", "pid,args").stdout
        assert processes.count("multiprocessing.spawn") == 2, processes


def test_a_worker_signs_in_with_a_key_from_the_admin_cli(stack: Stack) -> None:
    key = stack.admin_cli("create-worker-key", "--name", "gpu-box-1")
    assert key.startswith("owk_"), key
    started = stack.compose.run("run", "-d", "--no-deps", "-e", f"OASST_WORKER_API_KEY={key}", "worker-cpu")
    container = started.stdout.strip().splitlines()[-1]
    try:
        deadline = time.monotonic() + 90
        sessions: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            sessions = httpx.get(f"{stack.url}/admin/worker_sessions", headers=stack.admin_headers()).json()
            if any(s["worker_name"] == "gpu-box-1" for s in sessions):
                break
            time.sleep(1)
        assert any(s["worker_name"] == "gpu-box-1" and s["model_config_name"] == MODEL for s in sessions), (
            sessions
        )
        workers = httpx.get(f"{stack.url}/admin/workers", headers=stack.admin_headers()).json()
        assert [w["connected_sessions"] for w in workers if w["name"] == "gpu-box-1"] == [1]
    finally:
        stack.engine.docker("rm", "-f", container, check=False)


def test_embeddings_through_the_load_balancer(stack: Stack) -> None:
    key = stack.admin_cli("create-api-key", "--user", "dora")
    api = closing(httpx.Client(base_url=stack.url, headers={"Authorization": f"Bearer {key}"}, timeout=60))
    deadline = time.monotonic() + 180
    while EMBEDDING_MODEL not in [m["id"] for m in api.get("/v1/models").json()["data"]]:
        assert time.monotonic() < deadline, "the embedding worker did not connect"
        time.sleep(2)
    texts = ["a cat sleeps on the sofa", "a kitten naps on the couch", "the bond market fell today"]
    answer = api.post("/v1/embeddings", json={"model": EMBEDDING_MODEL, "input": texts})
    assert answer.status_code == 200, answer.text
    vectors = [item["embedding"] for item in answer.json()["data"]]
    assert [len(v) for v in vectors] == [384, 384, 384]

    def cosine(a: list[float], b: list[float]) -> float:
        return sum(x * y for x, y in zip(a, b, strict=True)) / (
            sum(x * x for x in a) ** 0.5 * sum(y * y for y in b) ** 0.5
        )

    # A real encoder: the two sentences about a cat are nearer each other than to the third.
    assert cosine(vectors[0], vectors[1]) > cosine(vectors[0], vectors[2]) + 0.2


# ---------------------------------------------------------------- a replica dies mid-answer


def test_killing_the_replica_that_streams_an_answer_does_not_stop_it(stack: Stack) -> None:
    key = stack.admin_cli("create-api-key", "--user", "carol")
    # Binary and unbuffered: the first bytes are read straight from the pipe, so that communicate()
    # below gets all the rest (a text wrapper would keep read-ahead text that communicate never sees).
    client = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "oasst_text_client",
            "--server-url",
            stack.url,
            "--api-key",
            key,
            "--max-new-tokens",
            "400",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        bufsize=0,
    )
    assert client.stdin and client.stdout
    client.stdin.write(STORY.encode() + b"\n")
    client.stdin.close()
    client.stdin = None  # closed: communicate() below must not flush it
    # Mid-answer: the first tokens have arrived.
    first = b""
    while len(first) < 20:
        piece = os.read(client.stdout.fileno(), 4096)
        assert piece, client.stderr.read() if client.stderr else b""
        first += piece

    streaming = [
        row
        for row in stack.lb_stats()
        if row["pxname"] == "api"
        and row["svname"] not in ("FRONTEND", "BACKEND")
        and int(row["scur"] or 0) > 0
    ]
    assert len(streaming) == 1, streaming
    address = streaming[0]["addr"].rsplit(":", 1)[0]
    replicas = {c: stack.container_ips(c) for c in stack.compose.containers("server")}
    matching = [c for c, ips in replicas.items() if address in ips]
    assert len(matching) == 1, f"addr {streaming[0].get('addr')!r}; {json.dumps(streaming[0])}; {replicas}"
    replica = matching[0]
    stack.engine.docker("kill", replica)
    log(f"killed {replica} ({address}), which was streaming the answer")
    try:
        rest, error_bytes = client.communicate(timeout=300)
        errors = error_bytes.decode(errors="replace")
        assert client.returncode == 0, errors
        answer = (first + rest).decode()
        # Through the surviving replica: the message is complete in the database.
        bearer = {"Authorization": f"Bearer {key}"}
        chats = httpx.get(f"{stack.url}/chats", headers=bearer, timeout=30).json()
        chat = httpx.get(f"{stack.url}/chats/{chats['chats'][0]['id']}", headers=bearer, timeout=30).json()
        final = chat["messages"][-1]
        assert final["state"] == "complete", final
        # It went on well past what had arrived before the kill.
        assert len(final["content"]) > len(first) + 200, final["content"]
        # What the client printed is the stored answer, no token lost or repeated across the reconnect
        # (after a retry on another worker, the voided partial text and a newline precede it).
        (stack.log_dir / "killed-replica-answer.txt").write_text(
            f"{answer}\n----- stored -----\n{final['content']}\n----- stderr -----\n{errors}"
        )
        stored = final["content"].strip()
        printed = answer.strip()
        assert printed.endswith(stored), _first_difference(printed, stored, errors)
    finally:
        stack.engine.docker("start", replica)
        stack.wait_healthy(replica)


def _first_difference(printed: str, stored: str, errors: str) -> str:
    tail = printed[-len(stored) :]
    at = next(
        (i for i, (a, b) in enumerate(zip(tail, stored, strict=False)) if a != b), min(len(tail), len(stored))
    )
    return (
        f"printed and stored answers differ at {at} of {len(stored)}: printed ...{tail[max(0, at - 60) : at + 60]!r}"
        f" stored ...{stored[max(0, at - 60) : at + 60]!r}; client stderr: {errors!r}"
    )


# ---------------------------------------------------------------- monitoring


def prometheus_query(stack: Stack, query: str) -> list[dict[str, Any]]:
    response = httpx.get(f"{stack.prometheus}/api/v1/query", params={"query": query}, timeout=10)
    response.raise_for_status()
    return response.json()["data"]["result"]


def test_prometheus_scrapes_every_replica_worker_backend_and_the_balancer(stack: Stack) -> None:
    wanted = {"server": 2, "worker": 2, "cpu-backend": 1, "lb": 1}
    deadline = time.monotonic() + 90
    up: dict[str, int] = {}
    while time.monotonic() < deadline:
        up = {}
        for series in prometheus_query(stack, "up == 1"):
            job = series["metric"]["job"]
            up[job] = up.get(job, 0) + 1
        if up == wanted:
            break
        time.sleep(2)
    assert up == wanted
    # Every replica's own metrics. (With OASST_SERVER_PROCESSES=2 a scrape sees the counters of the
    # process that answers it, so the counts of things that happened are checked on the workers.)
    replicas = prometheus_query(stack, 'count by (instance) (oasst_server_cancels_total{job="server"})')
    assert len(replicas) == 2, replicas
    jobs = prometheus_query(stack, "sum(oasst_worker_jobs_total)")
    assert jobs and float(jobs[0]["value"][1]) >= 1, jobs
    # The balancer's own health checks bring a restarted replica back (the kill test restarts one) a
    # few checks after Prometheus sees it up: wait for them too.
    while True:
        backends = prometheus_query(stack, 'haproxy_backend_active_servers{proxy="api"}')
        if (backends and float(backends[0]["value"][1]) == 2) or time.monotonic() > deadline + 60:
            break
        time.sleep(2)
    assert backends and float(backends[0]["value"][1]) == 2, backends


def test_grafana_is_provisioned_with_the_dashboard_and_its_queries_answer(stack: Stack) -> None:
    auth = (stack.env["GRAFANA_ADMIN_USER"], stack.env["GRAFANA_ADMIN_PASSWORD"])
    grafana = closing(httpx.Client(base_url=stack.grafana, auth=auth, timeout=30))
    assert httpx.get(f"{stack.grafana}/api/search", auth=("admin", "wrong")).status_code == 401
    dashboard_file = json.loads((ROOT / "deploy/grafana/dashboards/oasst-inference.json").read_text())
    found = grafana.get("/api/search").json()
    assert [d["uid"] for d in found] == [dashboard_file["uid"]]
    sources = grafana.get("/api/datasources").json()
    assert [(s["type"], s["url"]) for s in sources] == [("prometheus", "http://prometheus:9090")]
    dashboard = grafana.get(f"/api/dashboards/uid/{dashboard_file['uid']}").json()["dashboard"]
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    assert exprs
    with_data = set()
    for expr in exprs:
        answer = grafana.get(
            f"/api/datasources/proxy/uid/{sources[0]['uid']}/api/v1/query", params={"query": expr}
        )
        assert answer.status_code == 200 and answer.json()["status"] == "success", (expr, answer.text)
        if answer.json()["data"]["result"]:
            with_data.add(expr)
    # Panels of things that have happened by now have data (the workers' are single-process counts;
    # with two server processes per replica a scrape may come from the one that saw nothing).
    for expected in (
        "sum(oasst_worker_backend_healthy)",
        "sum by (outcome) (rate(oasst_worker_jobs_total[5m]))",
        "sum(rate(oasst_server_cancels_total[5m]))",
    ):
        assert expected in with_data, (expected, sorted(with_data))
