#!/usr/bin/env bash
# Build the llama-cpp-python wheel once and keep it in a wheelhouse outside the repository.
# llama-cpp-python publishes no wheels to PyPI: it compiles llama.cpp (3-5 minutes on 2 cores).
# The flags give a portable x86-64 (AVX2) build, so one cached wheel runs on any such machine.
set -euo pipefail
PYTHON=${PYTHON:-python3}
VERSION=${LLAMA_CPP_VERSION:?}
WHEELHOUSE=${WHEELHOUSE:?}
mkdir -p "$WHEELHOUSE"
if ls "$WHEELHOUSE"/llama_cpp_python-"$VERSION"-*.whl >/dev/null 2>&1; then
    exit 0
fi
echo ">>> building llama-cpp-python $VERSION (compiles llama.cpp: 3-5 minutes on 2 cores; done once,"
echo ">>> cached in $WHEELHOUSE)"
export CMAKE_ARGS=${CMAKE_ARGS:-"-DLLAVA_BUILD=OFF -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON"}
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}
log=$(mktemp)
tmp=$(mktemp -d)
# Progress: the build's step counter, "[12/180] Building C object ..." (Ninja, which scikit-build-core
# uses) or "[ 12%] ..." (Make), each line cut to the terminal's width; the whole log is kept for failures.
cols=$( (tput cols 2>/dev/null || echo 100) | tail -1)
if ! "$PYTHON" -m pip wheel -v --no-deps -w "$tmp" "llama-cpp-python==$VERSION" 2>&1 \
        | tee "$log" | grep --line-buffered -oE '^\s*\[ *[0-9]+(%|/[0-9]+)\].*' \
        | sed -u -E -e 's/^\s*/    /' -e 's|/[^ ]*/vendor/llama.cpp/||' -e "s/^(.{$((cols - 1))}).*/\1/"; then
    :
fi
if ! ls "$tmp"/llama_cpp_python-*.whl >/dev/null 2>&1; then
    echo "!!! building llama-cpp-python failed; the last lines of the log ($log):" >&2
    tail -40 "$log" >&2
    exit 1
fi
mv "$tmp"/llama_cpp_python-*.whl "$WHEELHOUSE"/
rm -rf "$tmp" "$log"
echo ">>> llama-cpp-python $VERSION built"
