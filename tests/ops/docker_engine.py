"""A private Docker engine for the compose stack test, and the images no registry can give us.

``DockerEngine`` starts Debian's ``dockerd`` as root with its own data root (kept in the cache
folder, so built images and their layers survive between runs), its own exec root and socket (in a
temporary folder), and stops it afterwards. One engine runs at a time per machine: a lock file in the
cache folder makes a second test run wait instead of sharing the data root.

No image registry can be reached, so the base image of the project's Dockerfiles (``debian:12.11-slim``)
is a ``debootstrap`` root file system of Debian bookworm, slimmed like the official image and imported
with ``docker import``; the third-party services of the compose file are stand-ins built on it from
Debian's packages (``tests/ops/standins``). The debootstrap tarball is cached by a key over everything
that shapes it; stand-ins and the project's images rebuild through Docker's layer cache whenever their
Dockerfile or files change.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

CACHE_DIR = Path(os.environ.get("OASST_CACHE_DIR", Path.home() / ".cache" / "oasst-inference"))
STANDINS_DIR = Path(__file__).resolve().parent / "standins"
BASE_IMAGE = "debian:12.11-slim"
SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
# Changing how the base root file system is made: bump this to rebuild the cached tarball.
BASE_RECIPE_VERSION = "1"
# What the official slim image leaves out (its /etc/dpkg/dpkg.cfg.d/docker).
DPKG_EXCLUDES = """path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
"""
APT_SOURCES = f"""Types: deb
URIs: {MIRROR}
Suites: {SUITE} {SUITE}-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: {SUITE}-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
"""
# This machine's package mirror serves a fixed snapshot whose Release files are past their
# Valid-Until date, and its egress proxy re-signs TLS with its own CA: the stand-in base carries both
# settings (the host's CA bundle and PIP_CERT, so that pip inside image builds reaches PyPI).
APT_SNAPSHOT_CONF = 'Acquire::Check-Valid-Until "false";\nAcquire::Check-Date "false";\n'
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
STANDIN_CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"


class DockerUnavailable(RuntimeError):
    """Docker cannot run on this machine; the message says why."""


_reporter: Callable[[str], None] = print


def set_reporter(reporter: Callable[[str], None]) -> None:
    """Where progress lines go (the test points this at pytest's terminal, so they show uncaptured)."""
    global _reporter
    _reporter = reporter


def log(message: str) -> None:
    _reporter(f"[docker] {message}")


@dataclass
class Timer:
    start: float

    @classmethod
    def now(cls) -> Timer:
        return cls(time.monotonic())

    def __str__(self) -> str:
        return f"{time.monotonic() - self.start:.1f}s"


class DockerEngine:
    def __init__(self, cache_dir: Path = CACHE_DIR) -> None:
        self.cache_dir = cache_dir
        self.data_root = cache_dir / "docker"
        # Socket paths must stay short (108 bytes): the run folder is in /tmp.
        self.run_dir = Path(tempfile.mkdtemp(prefix="oasst-dockerd-"))
        self.socket = self.run_dir / "docker.sock"
        self.host = f"unix://{self.socket}"
        self.log_path = self.run_dir / "dockerd.log"
        self._lock: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    # ------------------------------------------------------------ life cycle

    def start(self, timeout: float = 60) -> None:
        problems = []
        if os.geteuid() != 0:
            problems.append("dockerd must run as root (this test starts it)")
        for tool, package in (
            ("dockerd", "docker.io"),
            ("docker", "docker.io"),
            ("debootstrap", "debootstrap"),
        ):
            if shutil.which(tool) is None:
                problems.append(f"{tool} is missing (apt-get install {package}; make test installs it)")
        if shutil.which("docker-compose") is None:
            problems.append("docker-compose is missing (apt-get install docker-compose)")
        if problems:
            raise DockerUnavailable("; ".join(problems))
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        self._lock = os.open(self.cache_dir / "docker.lock", os.O_CREAT | os.O_RDWR)
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log("another test run uses the Docker engine of this cache folder: waiting for it")
            fcntl.flock(self._lock, fcntl.LOCK_EX)
        self._stop_leftover()
        self.data_root.mkdir(parents=True, exist_ok=True)
        # The child keeps its own copy of the log's descriptor: the parent's closes after the start.
        with self.log_path.open("wb") as log_file:
            self._proc = subprocess.Popen(
                [
                    "dockerd",
                    "--data-root",
                    str(self.data_root),
                    "--exec-root",
                    str(self.run_dir / "exec"),
                    "--pidfile",
                    str(self.cache_dir / "dockerd.pid"),
                    "-H",
                    self.host,
                    # Containers restarted by a previous run's policy must not come back on their own.
                    "--live-restore=false",
                ],
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while True:
            if self._proc.poll() is not None:
                raise DockerUnavailable(f"dockerd exited with {self._proc.returncode}:\n{self.log_tail()}")
            if self.socket.exists() and self.docker("info", check=False).returncode == 0:
                break
            if time.monotonic() > deadline:
                raise DockerUnavailable(f"dockerd did not answer in {timeout}s:\n{self.log_tail()}")
            time.sleep(0.3)
        # Containers left by an interrupted run (all in this private data root) are removed.
        leftovers = self.docker("ps", "-aq").stdout.split()
        if leftovers:
            self.docker("rm", "-f", *leftovers, check=False)
        log(f"dockerd {self.version()} running: data root {self.data_root}, socket {self.socket}")

    def stop(self) -> None:
        try:
            if self._proc is not None and self._proc.poll() is None:
                self._proc.send_signal(signal.SIGTERM)
                try:
                    self._proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    os.killpg(self._proc.pid, signal.SIGKILL)
                    self._proc.wait()
                log("dockerd stopped")
        finally:
            shutil.rmtree(self.run_dir, ignore_errors=True)
            if self._lock is not None:
                os.close(self._lock)  # releases the flock
                self._lock = None

    def _stop_leftover(self) -> None:
        """A dockerd of an interrupted run of this test, on the same data root, is stopped first."""
        pidfile = self.cache_dir / "dockerd.pid"
        try:
            pid = int(pidfile.read_text().strip())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError):
            return
        if cmdline[:1] != [b"dockerd"] or str(self.data_root).encode() not in cmdline:
            return
        log(f"stopping the dockerd of an interrupted run (pid {pid})")
        os.kill(pid, signal.SIGTERM)
        for _ in range(300):
            if not Path(f"/proc/{pid}").exists():
                return
            time.sleep(0.2)
        os.kill(pid, signal.SIGKILL)

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    # ------------------------------------------------------------ commands

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "DOCKER_HOST": self.host}

    def docker(
        self, *args: str, check: bool = True, timeout: float = 600, input: bytes | None = None
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            ["docker", *args],
            env=self.env,
            capture_output=True,
            text=input is None,
            input=input,
            timeout=timeout,
        )
        if check and result.returncode != 0:
            raise RuntimeError(f"docker {' '.join(args)} failed ({result.returncode}):\n{result.stderr}")
        return result  # type: ignore[return-value]

    def version(self) -> str:
        return self.docker("version", "--format", "{{.Server.Version}}").stdout.strip()

    def image_label(self, image: str, label: str) -> str | None:
        result = self.docker(
            "image", "inspect", "--format", f'{{{{index .Config.Labels "{label}"}}}}', image, check=False
        )
        return result.stdout.strip() or None if result.returncode == 0 else None

    def build(self, tag: str, context: Path, dockerfile: str = "Dockerfile", timeout: float = 1200) -> None:
        """``docker build`` with the output kept for failures (the legacy builder: no BuildKit here)."""
        result = self.docker(
            "build", "-t", tag, "-f", str(context / dockerfile), str(context), check=False, timeout=timeout
        )
        if result.returncode != 0:
            raise RuntimeError(f"building {tag} failed:\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}")


# ---------------------------------------------------------------- the base image


def base_key() -> str:
    """Everything that shapes the base root file system."""
    digest = hashlib.sha256()
    for part in (BASE_RECIPE_VERSION, SUITE, MIRROR, DPKG_EXCLUDES, APT_SOURCES, APT_SNAPSHOT_CONF):
        digest.update(part.encode())
    if HOST_CA_BUNDLE.is_file():
        digest.update(HOST_CA_BUNDLE.read_bytes())
    return digest.hexdigest()[:16]


def _make_rootfs(target: Path) -> None:
    result = subprocess.run(
        ["debootstrap", "--variant=minbase", SUITE, str(target), MIRROR],
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        raise DockerUnavailable(f"debootstrap failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    # Slim like the official image: no documentation, manuals or translations, no package lists.
    for pattern in (
        "usr/share/doc/*",
        "usr/share/man/*",
        "usr/share/info/*",
        "usr/share/locale/*",
        "var/cache/apt/*.bin",
        "var/cache/apt/archives/*.deb",
        "var/lib/apt/lists/*",
    ):
        for path in target.glob(pattern):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
    (target / "etc/dpkg/dpkg.cfg.d/docker").write_text(DPKG_EXCLUDES)
    (target / "etc/apt/apt.conf.d/docker-clean").write_text(
        'DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/*.bin || true"; };\n'
        'APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/*.bin || true"; };\n'
        'Dir::Cache::pkgcache ""; Dir::Cache::srcpkgcache "";\n'
    )
    (target / "etc/apt/apt.conf.d/docker-no-languages").write_text('Acquire::Languages "none";\n')
    (target / "etc/apt/apt.conf.d/99snapshot-mirror").write_text(APT_SNAPSHOT_CONF)
    (target / "etc/apt/sources.list").unlink(missing_ok=True)
    (target / "etc/apt/sources.list.d/debian.sources").write_text(APT_SOURCES)
    if HOST_CA_BUNDLE.is_file():
        bundle = target / STANDIN_CA_BUNDLE.lstrip("/")
        bundle.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(HOST_CA_BUNDLE, bundle)
        extra = target / "usr/local/share/ca-certificates"
        extra.mkdir(parents=True, exist_ok=True)
        for cert in Path("/usr/local/share/ca-certificates").glob("*.crt"):
            shutil.copyfile(cert, extra / cert.name)


def ensure_base_image(engine: DockerEngine) -> None:
    key = base_key()
    if engine.image_label(BASE_IMAGE, "oasst.standin.key") == key:
        log(f"{BASE_IMAGE}: stand-in up to date (key {key})")
        return
    tarball = engine.cache_dir / "debootstrap" / f"{SUITE}-minbase-{key}.tar"
    if not tarball.is_file():
        timer = Timer.now()
        log(f"making a {SUITE} root file system with debootstrap (cached as {tarball.name})")
        tarball.parent.mkdir(parents=True, exist_ok=True)
        for old in tarball.parent.glob(f"{SUITE}-minbase-*.tar"):
            old.unlink()
        with tempfile.TemporaryDirectory(prefix="oasst-rootfs-") as tmp:
            rootfs = Path(tmp) / "rootfs"
            _make_rootfs(rootfs)
            partial = tarball.with_suffix(".partial")
            subprocess.run(["tar", "-C", str(rootfs), "-cf", str(partial), "."], check=True)
            partial.rename(tarball)
        log(f"root file system ready in {timer}")
    changes = [
        f"LABEL oasst.standin.key={key}",
        'LABEL oasst.standin="debootstrap bookworm minbase (tests/ops/docker_engine.py)"',
        f"ENV PIP_CERT={STANDIN_CA_BUNDLE}",
        'CMD ["bash"]',
    ]
    args = [arg for change in changes for arg in ("--change", change)]
    engine.docker("import", *args, str(tarball), BASE_IMAGE, timeout=300)
    log(f"{BASE_IMAGE}: stand-in imported from {tarball.name}")


# ---------------------------------------------------------------- stand-ins


STANDINS = ("postgres", "redis", "haproxy", "prometheus", "grafana")


def build_standins(engine: DockerEngine, tags: dict[str, str]) -> None:
    """Build each stand-in of ``tests/ops/standins`` and tag it with the compose file's image name."""
    for name in STANDINS:
        timer = Timer.now()
        engine.build(tags[name], STANDINS_DIR / name)
        log(f"{tags[name]}: stand-in built from tests/ops/standins/{name} ({timer}) - not the official image")


# ---------------------------------------------------------------- compose


@dataclass
class Compose:
    engine: DockerEngine
    project_dir: Path
    project: str
    profiles: Sequence[str]

    def run(self, *args: str, check: bool = True, timeout: float = 900) -> subprocess.CompletedProcess[str]:
        profiles = [arg for profile in self.profiles for arg in ("--profile", profile)]
        result = subprocess.run(
            [
                "docker-compose",
                "-p",
                self.project,
                "--project-directory",
                str(self.project_dir),
                "-f",
                str(self.project_dir / "docker-compose.yml"),
                *profiles,
                *args,
            ],
            env={**self.engine.env, "COMPOSE_HTTP_TIMEOUT": "300"},
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=self.project_dir,
        )
        if check and result.returncode != 0:
            raise RuntimeError(
                f"docker-compose {' '.join(args)} failed:\n{result.stdout[-4000:]}\n{result.stderr[-6000:]}"
            )
        return result

    def containers(self, service: str) -> list[str]:
        names = self.engine.docker(
            "ps",
            "--filter",
            f"label=com.docker.compose.project={self.project}",
            "--filter",
            f"label=com.docker.compose.service={service}",
            "--format",
            "{{.Names}}",
        ).stdout.split()
        return sorted(names)

    def inspect(self, container: str) -> dict:
        return json.loads(self.engine.docker("inspect", container).stdout)[0]

    def logs(self, tail: int = 60) -> str:
        return self.run("logs", "--no-color", "--tail", str(tail), check=False).stdout


@contextlib.contextmanager
def running_engine() -> Iterator[DockerEngine]:
    engine = DockerEngine()
    try:
        engine.start()
        yield engine
    finally:
        engine.stop()


def build_project_images(compose: Compose, services: Sequence[str], log_dir: Path) -> None:
    """Build the project's images of ``services`` as compose does, keeping their build stages as cache.

    The build stage of each Dockerfile is built first and tagged (``oasst-build-cache/SERVICE``): an
    untagged stage would be a dangling image, and pruning the images a rebuild leaves behind would
    delete the layer cache with it. Then ``docker-compose build`` builds the images (from that cache).
    """
    import yaml

    config = yaml.safe_load(compose.run("config").stdout)
    timer = Timer.now()
    stages = []
    for service in services:
        build = config["services"][service]["build"]
        context = Path(build["context"])
        log_path = log_dir / f"build-{service}.log"
        with log_path.open("wb") as build_log:
            proc = subprocess.Popen(
                [
                    "docker",
                    "build",
                    "--target",
                    "build",
                    "-t",
                    f"oasst-build-cache/{service}:latest",
                    *[f"--build-arg={name}={value}" for name, value in (build.get("args") or {}).items()],
                    "-f",
                    str(context / build["dockerfile"]),
                    str(context),
                ],
                env=compose.engine.env,
                stdout=build_log,
                stderr=subprocess.STDOUT,
            )
        stages.append((service, proc, log_path))
    for service, proc, log_path in stages:
        if proc.wait(timeout=1800) != 0:
            tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-60:])
            raise RuntimeError(f"building the build stage of {service} failed:\n{tail}")
    log(f"build stages of {', '.join(services)} ready ({timer})")
    timer = Timer.now()
    result = compose.run("build", "--parallel", *services, timeout=1800)
    (log_dir / "compose-build.log").write_text(result.stdout + result.stderr)
    log(f"images of {', '.join(services)} built by docker-compose build ({timer})")
