#!/usr/bin/env bash
# Pin every Python dependency of the images: resolves each image's packages against PyPI (pip's
# resolver, in dry-run mode: nothing is installed) and writes deploy/requirements/IMAGE.txt, the
# complete set of third-party packages with exact versions. The Dockerfiles install exactly these
# (pip install --no-deps, then pip check), so two builds months apart give the same image.
# Run it after changing a dependency in a pyproject.toml; tests/ops/test_image_requirements.py
# fails until the lock files agree with the pyproject files.
#
# The resolution runs on the images' own Python, Debian bookworm's python3 (3.11.2), because
# environment markers (such as redis' `async-timeout; python_version < "3.11.3"`) must come out as in
# the image: on a Debian bookworm host that is /usr/bin/python3, else set IMAGE_PYTHON.
#
#   deploy/lock-requirements.sh
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
IMAGE_PYTHON=${IMAGE_PYTHON:-/usr/bin/python3}
WANTED_VERSION=3.11.2
LLAMA_CPP_VERSION=$(sed -n 's/^LLAMA_CPP_VERSION ?= //p' Makefile)
WHEELHOUSE=${WHEELHOUSE:-$HOME/.cache/oasst-inference/wheels}
OUT=deploy/requirements
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
version=$("$IMAGE_PYTHON" -c 'import platform; print(platform.python_version())')
if [ "$version" != "$WANTED_VERSION" ]; then
    echo "!!! $IMAGE_PYTHON is Python $version; the images run Debian bookworm's $WANTED_VERSION (set IMAGE_PYTHON)" >&2
    exit 1
fi
"$IMAGE_PYTHON" -m venv "$tmp/venv"
PYTHON=$tmp/venv/bin/python

# This machine's pip configuration may name extra local indexes; the lock must come from PyPI alone.
export PIP_CONFIG_FILE=/dev/null PIP_FIND_LINKS= PIP_DISABLE_PIP_VERSION_CHECK=1

lock() { # lock IMAGE EXCLUDED-NAME-REGEX PACKAGE...
    local image=$1 exclude=$2
    shift 2
    echo ">>> resolving $image: $*"
    "$PYTHON" -m pip install --dry-run --ignore-installed --quiet --find-links "$WHEELHOUSE" \
        --report "$tmp/$image.json" "$@"
    "$PYTHON" - "$tmp/$image.json" "$exclude" "$OUT/$image.txt" "$image" <<'PY'
import json, re, sys
report, exclude, out, image = sys.argv[1:]
pins = sorted(
    (i["metadata"]["name"], i["metadata"]["version"])
    for i in json.load(open(report))["install"]
    if not re.fullmatch(exclude, i["metadata"]["name"].lower().replace("_", "-"))
)
with open(out, "w") as f:
    f.write(f"# The third-party packages of the {image} image, pinned: written by deploy/lock-requirements.sh.\n")
    f.writelines(f"{name}=={version}\n" for name, version in sorted(pins, key=lambda p: p[0].lower()))
print(f"    {len(pins)} packages -> {out}")
PY
}

OWN='oasst-shared|oasst-inference-server|oasst-inference-worker'
# The build backend of the project's own packages (installed with --no-build-isolation).
lock build '' "$(sed -n 's/^requires = \["\(setuptools[^"]*\)"\]$/\1/p' inference/server/pyproject.toml)"
lock server "$OWN" ./oasst_shared ./inference/server
lock worker "$OWN" ./oasst_shared ./inference/worker
# llama-cpp-python itself comes from the wheel stage of Dockerfile.cpu-backend; its dependencies are pinned here.
lock cpu-backend "$OWN|llama-cpp-python" ./oasst_shared "./inference/worker[cpu]" "llama-cpp-python==$LLAMA_CPP_VERSION"
# torch's CPU build (PyPI's is the CUDA one): from a folder holding its wheel, or PyTorch's CPU index.
TORCH_FIND_LINKS=${TORCH_FIND_LINKS:-/opt/wheels}
TORCH_INDEX_URL=${TORCH_INDEX_URL:-}
lock worker-embedding "$OWN" --find-links "$TORCH_FIND_LINKS" ${TORCH_INDEX_URL:+--extra-index-url "$TORCH_INDEX_URL"} \
    ./oasst_shared "./inference/worker[embedding]"
if ! grep -q '^torch==.*+cpu$' "$OUT/worker-embedding.txt"; then
    echo "!!! worker-embedding: torch is not the CPU build: set TORCH_FIND_LINKS to a folder with its wheel," >&2
    echo "!!! or TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu" >&2
    exit 1
fi
