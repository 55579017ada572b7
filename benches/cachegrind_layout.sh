#!/usr/bin/env bash
# Simulated L1-d read misses of one matvec, tiled vs a row-major baseline (paper §5.4, Table 5.2).
#
#   benches/cachegrind_layout.sh [SHAPE] [D] [DFF] [BASELINE]
#     SHAPE     dense-down | qkv | gate-up | expert        (default dense-down)
#     D, DFF    model width and dense hidden width          (default 8192 32768: the paper's
#                                                             arch2_4_8k_4l geometry)
#     BASELINE  naive | blocked                              (default naive: the paper's loop)
#   env D1=size,assoc,line   simulated L1-d (default 32768,8,64: the paper's Xeon E5-2650)
#   env BIN=path             the cflow-tui binary (default target/release/cflow-tui)
#
# There is no hardware PMU in this VM, so the counts come from valgrind's cachegrind. Only the
# matvec is counted: each arm runs twice under cachegrind, once with `--iters 0` (set-up only:
# generating and tiling the matrix) and once with `--iters 1 --warmup 0` (set-up + one matvec);
# the difference of the D1mr (L1-d read miss) totals is the matvec's. One thread.
# Prints the tiled and baseline counts, their ratio, and the paper's decomposition of a naive
# count: weight cache lines + one re-read of the f32 activation per output row.
set -euo pipefail
cd "$(dirname "$0")/.."
shape=${1:-dense-down}
d=${2:-8192}
dff=${3:-32768}
baseline=${4:-naive}
D1=${D1:-32768,8,64}
BIN=${BIN:-target/release/cflow-tui}
case "$shape" in dense-down | qkv | gate-up | expert) ;; *)
    echo "unknown shape '$shape' (dense-down, qkv, gate-up or expert)" >&2; exit 2 ;; esac
case "$baseline" in naive | blocked) ;; *)
    echo "unknown baseline '$baseline' (naive or blocked)" >&2; exit 2 ;; esac
command -v valgrind >/dev/null || { echo "valgrind not found (apt-get install -y valgrind)" >&2; exit 1; }
[ -x "$BIN" ] || cargo build --release
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# D1mr and Dr totals of one run: the "summary:" line of the cachegrind output file, read in the
# order its "events:" line names.
run() { # arm iters warmup -> "D1mr Dr"
    local out="$work/cg.$1.$2"
    valgrind --tool=cachegrind --cache-sim=yes --D1="$D1" --cachegrind-out-file="$out" \
        "$BIN" bench layout --shape "$shape" --d "$d" --dff "$dff" --baseline "$baseline" \
        --threads 1 --iters "$2" --warmup "$3" --only "$1" >/dev/null 2>"$work/log.$1.$2" ||
        { cat "$work/log.$1.$2" >&2; exit 1; }
    awk '/^events:/ { for (i = 2; i <= NF; i++) ix[$i] = i }
         /^summary:/ { print $(ix["D1mr"]), $(ix["Dr"]) }' "$out"
}

echo "cachegrind D1=$D1 (size,assoc,line), shape $shape, d=$d dff=$dff, baseline $baseline, 1 thread"
declare -A miss reads
for arm in tiled baseline; do
    t0=$(date +%s)
    run "$arm" 0 0 >"$work/r0" || exit 1
    run "$arm" 1 0 >"$work/r1" || exit 1
    read -r m0 r0 <"$work/r0"
    read -r m1 r1 <"$work/r1"
    miss[$arm]=$((m1 - m0))
    reads[$arm]=$((r1 - r0))
    echo "  $arm: D1 read misses ${miss[$arm]} of ${reads[$arm]} reads (matvec only; $(($(date +%s) - t0)) s under cachegrind)"
done
line=${D1##*,}
# Weight bytes of the shape (Q4_0: 18 bytes per 32 weights) and its rows and columns.
case "$shape" in
dense-down) rows=$d; cols=$dff; n=1 ;;
qkv) rows=$d; cols=$d; n=3 ;;
gate-up) rows=$dff; cols=$d; n=2 ;;
expert) rows=$((d / 2)); cols=$d; n=2 ;;
*) echo "unknown shape $shape" >&2; exit 2 ;;
esac
wl=$((n * rows * cols / 32 * 18 / line))
al=$((n * rows * cols * 4 / line))
awk -v t="${miss[tiled]}" -v b="${miss[baseline]}" -v wl="$wl" -v al="$al" -v base="$baseline" 'BEGIN {
    printf "  %s/tiled = %.2fx fewer D1 read misses with the tile layout (paper: 7.29x, 19.3M vs 2.64M at 8192x32768)\n", base, b / t
    printf "  decomposition: weight lines %d + f32 activation re-read per row %d = %d (naive, predicted)\n", wl, al, wl + al
}'
