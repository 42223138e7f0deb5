#!/usr/bin/env bash
# System tools the tests drive: Chromium (web page tests), tmux (full-dev-setup.sh), redis-server
# (the Redis fault tests start their own), shellcheck (the shell scripts), and Docker's engine with
# docker-compose v1 and debootstrap (tests/ops/test_compose_stack.py starts its own dockerd, builds the
# images and runs the compose stack). Installed with apt when missing and we are root; otherwise we
# say what is missing and the tests that need it fail with a clear message.
set -euo pipefail
missing=()
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v tmux >/dev/null 2>&1 || missing+=(tmux)
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v docker-compose >/dev/null 2>&1 || missing+=(docker-compose)
command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
command -v shellcheck >/dev/null 2>&1 || missing+=(shellcheck)
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo ">>> installing system packages: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq "${missing[@]}" >/dev/null
else
    echo "!!! missing system packages (install them for the full test suite): ${missing[*]}" >&2
fi
