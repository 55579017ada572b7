#!/usr/bin/env bash
# Builds llama.cpp's llama-quantize (CPU only) from the llama-cpp-python sdist on PyPI, the same
# source as ../shared/bench/setup.sh, for the K-quant parity tests (tests/reference/
# requantize_smollm2.sh). Idempotent. Prints the directory holding llama-quantize as its last
# line. DIR (default ~/.cache/cflow-tui/llama-tools) holds the venv, the sdist and the build;
# LLCPP_VER (default 0.3.36) picks the release. About 5-10 minutes on 2 cores.
set -euo pipefail
dir="${DIR:-$HOME/.cache/cflow-tui/llama-tools}"
ver="${LLCPP_VER:-0.3.36}"
jobs="${JOBS:-$(nproc)}"
bin="$dir/build/bin"
if [ -x "$bin/llama-quantize" ]; then echo "$bin"; exit 0; fi
mkdir -p "$dir"
[ -x "$dir/venv/bin/python" ] || python3 -m venv "$dir/venv"
"$dir/venv/bin/pip" install -q cmake==4.4.5 ninja==1.13.2 >&2
src="$dir/sdist/llama_cpp_python-$ver"
if [ ! -d "$src" ]; then
    mkdir -p "$dir/sdist"
    "$dir/venv/bin/pip" download -q --no-deps --no-binary llama-cpp-python \
        "llama-cpp-python==$ver" -d "$dir/sdist" >&2
    tar xzf "$dir/sdist/llama_cpp_python-$ver.tar.gz" -C "$dir/sdist"
fi
echo "building llama-quantize $ver in $dir/build (log: $dir/build.log)" >&2
PATH="$dir/venv/bin:$PATH" cmake -S "$src/vendor/llama.cpp" -B "$dir/build" -G Ninja \
    -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF > "$dir/build.log" 2>&1
PATH="$dir/venv/bin:$PATH" cmake --build "$dir/build" --target llama-quantize -j "$jobs" \
    >> "$dir/build.log" 2>&1 || { tail -n 30 "$dir/build.log" >&2; exit 1; }
echo "$bin"
