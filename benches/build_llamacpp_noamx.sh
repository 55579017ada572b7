#!/usr/bin/env bash
# Builds llama-bench from the same llama.cpp sources as ../shared/bench/setup.sh, with every
# x86 extension of an AVX-512 machine named explicitly except AMX (GGML_NATIVE=OFF).
#
# Why: on an Intel guest whose CPUID lists AMX (amx_tile, amx_int8), the GGML_NATIVE build's
# prompt processing dies with SIGILL in ggml's AMX kernel (`tileloadd` in
# tinygemm_kernel_amx<block_q8_1, block_q4_1>, seen under gdb), also with the process's AMX
# permission granted beforehand; its decode (tg) runs. AMX itself works on that guest (a
# TDPBSSD test program and cflow's own AMX path run). This build is llama.cpp's best working
# CPU path there: AVX-512 F/BW/VL/VBMI/VNNI/BF16 and its repacked Q4_0.
#
# Usage: benches/build_llamacpp_noamx.sh   (then LLAMA_BENCH=$ANCHOR_DIR/llcpp-noamx/bin/llama-bench)
# Environment: ANCHOR_DIR [/tmp/anchor] (setup.sh must have run: venv and sdist), JOBS [nproc].
set -euo pipefail
ANCHOR_DIR="${ANCHOR_DIR:-/tmp/anchor}"
JOBS="${JOBS:-$(nproc)}"
SRC="$(ls -d "$ANCHOR_DIR"/sdist/llama_cpp_python-*/vendor/llama.cpp 2>/dev/null | head -1)"
[ -n "$SRC" ] || { echo "no llama.cpp sources under $ANCHOR_DIR/sdist: run ../shared/bench/setup.sh first" >&2; exit 1; }
V="$ANCHOR_DIR/venv/bin"
BUILD="$ANCHOR_DIR/llcpp-noamx"
PATH="$V:$PATH" "$V/cmake" -S "$SRC" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON \
    -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON \
    -DGGML_AVX_VNNI=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
    -DLLAMA_BUILD_TOOLS=ON > "$ANCHOR_DIR/noamx-build.log" 2>&1
PATH="$V:$PATH" "$V/cmake" --build "$BUILD" --target llama-bench -j "$JOBS" >> "$ANCHOR_DIR/noamx-build.log" 2>&1
echo "$BUILD/bin/llama-bench"
