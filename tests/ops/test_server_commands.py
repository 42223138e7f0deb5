"""Every way the server is started runs ``serve.run``, and so the protocol that bounds request heads and
caps connections (tests/e2e/test_connection_limits.py shows it at work): the image, the compose service,
the Kubernetes container, ``make up``, ``full-dev-setup.sh``, the benchmarks and the test stacks. A
command that ran uvicorn on the app directly would start a server without those bounds."""

from __future__ import annotations

import json
import re

from oasst_inference_server.api.connection_guard import (
    ConnectionLimits,
    GuardedConfig,
    GuardedHttpToolsProtocol,
)
from tests.ops.test_compose import COMPOSE_FILE, ROOT, load_compose
from tests.ops.test_k8s_manifests import manifests

SERVER_MODULE = "oasst_inference_server"


def test_the_command_runs_serve_with_the_guarded_protocol():
    pyproject = (ROOT / "inference/server/pyproject.toml").read_text()
    assert f'oasst-server = "{SERVER_MODULE}.__main__:main"' in pyproject
    main = (ROOT / "inference/server" / SERVER_MODULE / "__main__.py").read_text()
    assert "from oasst_inference_server.serve import run" in main
    limits = ConnectionLimits(header_timeout=1.0, max_header_bytes=4096, max_connections=3)
    config = GuardedConfig("oasst_inference_server.serve:app_factory", limits=limits, factory=True)
    assert config.http is GuardedHttpToolsProtocol and config.connection_limits == limits


def test_the_image_compose_and_kubernetes_run_the_command():
    dockerfile = (ROOT / "inference/server/Dockerfile").read_text()
    assert json.loads(re.findall(r"^CMD (.+)$", dockerfile, re.M)[-1]) == ["oasst-server"]
    assert "ENTRYPOINT" not in dockerfile
    server = load_compose()["services"]["server"]
    assert "command" not in server and "entrypoint" not in server
    container = next(
        c
        for c in manifests()[("Deployment", "oasst-server")]["spec"]["template"]["spec"]["containers"]
        if c["name"] == "server"
    )
    assert "command" not in container and "args" not in container


def test_local_stacks_run_the_module():
    up = (ROOT / "scripts/up.py").read_text()
    assert f'"{SERVER_MODULE}",' in up
    assert re.search(r'"\$ROOT/\.venv/bin/oasst-server"', (ROOT / "full-dev-setup.sh").read_text())
    stacks = (ROOT / "tests/support/stacks.py").read_text()
    assert stacks.count(f'"{SERVER_MODULE}"') >= 2
    bench = (ROOT / "bench/stack.py").read_text()
    assert f'"-m", "{SERVER_MODULE}"' in bench


def test_nothing_runs_uvicorn_on_the_server_app_directly():
    places = [
        COMPOSE_FILE,
        ROOT / "Makefile",
        ROOT / "full-dev-setup.sh",
        ROOT / "inference/server/Dockerfile",
        *(ROOT / "deploy").rglob("*.yaml"),
        *(ROOT / "deploy").rglob("*.sh"),
        *(ROOT / "scripts").glob("*"),
        *(ROOT / "bench").glob("*.py"),
        *(ROOT / "tests/support").glob("*.py"),
    ]
    for path in places:
        if path.is_file():
            text = path.read_text(errors="replace")
            assert not re.search(r"uvicorn\b.*oasst_inference_server|oasst_inference_server\.main:", text), (
                path
            )
    # In the package, only serve.py starts a server (uvicorn.Server), and nothing calls uvicorn.run.
    package = ROOT / "inference/server" / SERVER_MODULE
    for path in package.rglob("*.py"):
        text = path.read_text()
        assert "uvicorn.run(" not in text, path
        if "uvicorn.Server(" in text:
            assert path == package / "serve.py", path
