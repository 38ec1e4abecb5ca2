#!/usr/bin/env bash
# One prepared GPU check for a single-GPU machine (one H200, CUDA 13 driver,
# NCCL in some Python environment, no Rust toolchain): binaries and the
# CUDA executor's compiled kernels are built here and carried, the run is
# one command within GPU_CHECK_BUDGET seconds (default 420, at most 540),
# every step has its own timeout, at most 7 files land in $OUT, and one
# table comes last.
#
#   scripts/gpu-check.sh --build   (here) build the release CLI and the CUDA
#                                  and NCCL conformance tests, stripped, and
#                                  the executor's cubins for sm_90, into
#                                  target/gpu-bundle (or $BUNDLE)
#   bash scripts/gpu-check.sh      (on the GPU machine, carrying the bundle)
#
# Steps (file), most important first (a step that would overrun the budget
# is skipped and says so):
#   1 environment: `ferrocoll info` with the kernels' registers, local
#     memory and blocks per SM (info.txt)
#   2 bandwidth, all-reduce 256 MiB - 1 GiB, -c 0: the executor and NCCL
#     with K = 1, 2, 4, 8 ranks on GPU 0, the device's copy bound measured
#     in the same run (bandwidth.txt)
#   3 small calls, 8 B - 1 MiB: the executor all Simple and all LL, NCCL
#     beside, K = 1, 2, 8 (latency.txt)
#   3b calibration of the simulator's assumed GPU costs: one block's
#     loads and stores (1 rank, 1 channel, 256 MiB) and one instruction's
#     cost (1 channel, 8 B, K = 1 and 8) (bandwidth.txt, latency.txt)
#   4 correctness <= 64 MiB, checked: every collective, bf16 at aligned and
#     unaligned sizes, K = 2, 4, 8 (check.txt)
#   5 the conformance kit, the failures, graph capture and replay, the
#     relay through host memory (conformance.txt)
#   6 two processes on the one GPU must be refused; NCCL's own conformance
#     with ranks sharing the GPU (other.txt)
#   then summary.txt: the table for docs/benchmarks.md (scripts/gpu-table.py)
set -uo pipefail
cd "$(dirname "$0")/.."
BUNDLE="${BUNDLE:-target/gpu-bundle}"

usage() {
  sed -n '2,/^set -uo pipefail/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
}
case "${1:-}" in
  -h | --help) usage; exit 0 ;;
  "" | --build) ;;
  *) echo "gpu-check.sh: unknown argument \`$1'" >&2; usage >&2; exit 2 ;;
esac

if [ "${1:-}" = "--build" ]; then
  set -e
  cargo build --release -q
  # The kernels are compiled here, at the end: without NVRTC the bundle
  # would ship none, and every process on the GPU would compile its own
  # (1.5-4 s each), overrunning the steps. Refuse before the long builds.
  nvrtc=$("${CARGO_TARGET_DIR:-target}/release/ferrocoll" info --no-measure 2> /dev/null || true)
  if ! grep -q '^nvrtc  *[0-9]' <<< "$nvrtc"; then
    echo "gpu-check.sh --build: NVRTC not found; put libnvrtc on LD_LIBRARY_PATH and the CUDA" >&2
    echo "headers in FERROCOLL_CUDA_INCLUDE (.ci/run installs both from the NVRTC wheels)" >&2
    exit 1
  fi
  mkdir -p "$BUNDLE"
  for t in cuda_conformance nccl_conformance; do
    path=$(cargo test --release -q --workspace --no-run --message-format=json-render-diagnostics \
      | grep -o "\"executable\":\"[^\"]*$t[^\"]*\"" | head -n 1 | cut -d'"' -f4)
    cp "$path" "$BUNDLE/$t"
  done
  cp "${CARGO_TARGET_DIR:-target}/release/ferrocoll" "$BUNDLE/"
  # What travels to the device machine is capped at 64 MiB: no debug info.
  command -v strip > /dev/null && strip "$BUNDLE"/ferrocoll "$BUNDLE"/*_conformance
  # The kernels, compiled here by NVRTC (no GPU needed): the GPU loads them
  # from the cache instead of compiling (keyed by source, arch and CUDA
  # major; a stale or missing one is compiled there).
  rm -rf "$BUNDLE/kernels"
  FERROCOLL_KERNEL_CACHE="$BUNDLE/kernels" "$BUNDLE/ferrocoll" info --no-measure --compile-kernels sm_90 | tail -n 3
  cp scripts/gpu-table.py "$BUNDLE/"
  du -sh "$BUNDLE"
  exit 0
fi

OUT="${OUT:-/tmp/gpu-check}"
# The rows as JSON for the table, beside $OUT (only 8 files come back).
JSON="${OUT%/}-json"
mkdir -p "$OUT" "$JSON"
START=$SECONDS
BUDGET="${GPU_CHECK_BUDGET:-420}"
[ "$BUDGET" -gt 540 ] && BUDGET=540
FC="$BUNDLE/ferrocoll"
summary=()

# A step gets its own limit, never more than what is left of the budget.
step() {
  local name=$1 limit=$2 file=$3
  shift 3
  local left=$((BUDGET - (SECONDS - START)))
  [ "$limit" -gt "$left" ] && limit=$left
  if [ "$limit" -lt 5 ]; then
    summary+=("$(printf '%-40s %s' "$name" "skipped: out of time")")
    return
  fi
  local t0=$SECONDS
  # The executor's own timeout ends before the step's, so a hang ends in
  # its error naming the stuck rank, not in `timeout` killing the step
  # (the library's default is 10 minutes).
  local wait_ms=$(((limit * 2 / 3) * 1000))
  [ -n "${FERROCOLL_TIMEOUT_MS:-}" ] && [ "$FERROCOLL_TIMEOUT_MS" -lt "$wait_ms" ] && wait_ms=$FERROCOLL_TIMEOUT_MS
  echo "== $name (limit ${limit}s, FERROCOLL_TIMEOUT_MS=$wait_ms)" | tee -a "$OUT/$file"
  FERROCOLL_TIMEOUT_MS=$wait_ms timeout --kill-after=5 "$limit" "$@" >> "$OUT/$file" 2>&1
  local rc=$?
  local verdict="rc $rc"
  [ "$rc" -eq 124 ] && verdict="timed out"
  summary+=("$(printf '%-40s %-10s %4ds  %s' "$name" "$verdict" $((SECONDS - t0)) "$file")")
}

# First, so that even the preamble's `info` reads the carried kernels
# instead of compiling into the default cache.
export FERROCOLL_KERNEL_CACHE="$BUNDLE/kernels"

# Libraries from Python environments that are not on PATH (an unactivated
# venv or conda env): the binaries search PATH's Pythons themselves.
find_lib() {
  timeout 20 find / -xdev -maxdepth 9 -name "$1" -path '*nvidia*' 2> /dev/null | head -n 1
}
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  [ -d "$d" ] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
# Read into a variable, then searched: `info | grep -q` under pipefail
# reads as "not found" whenever grep stops reading early.
libs=$("$FC" info --no-measure 2> /dev/null || true)
if ! grep -q '^nccl  *[0-9].* at /' <<< "$libs"; then
  nccl=$(find_lib 'libnccl.so.2')
  [ -n "$nccl" ] && export FERROCOLL_NCCL_LIB="$nccl"
fi
if ! grep -q '^nvrtc  *[0-9].* at /' <<< "$libs"; then
  nvrtc=$(find_lib 'libnvrtc.so.1*')
  [ -n "$nvrtc" ] && export LD_LIBRARY_PATH="$(dirname "$nvrtc")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
export FERROCOLL_CUDA_INCLUDE="${FERROCOLL_CUDA_INCLUDE:-/usr/local/cuda/include}"
export FERROCOLL_REQUIRE_GPU=1
grep -h MemAvailable /proc/meminfo 2> /dev/null | tee -a "$OUT/info.txt"
# NCCL before 2.30 cannot put several ranks on one GPU: compare with it at
# K = 1 only then (a refused comparison would only cost the step's time).
nccl_version=$("$FC" info --no-measure 2> /dev/null | sed -n 's/^nccl  *\([0-9][0-9.]*\).*/\1/p')
nccl_multi=0
if [ -n "$nccl_version" ] && [ "$(printf '%s\n' 2.30 "$nccl_version" | sort -V | head -n 1)" = 2.30 ]; then
  nccl_multi=1
fi
echo "nccl $nccl_version: compared at K > 1: $([ $nccl_multi = 1 ] && echo yes || echo no)" | tee -a "$OUT/info.txt"
compare() { # K: the --compare flag for K ranks, or nothing
  if [ "$1" -eq 1 ] || [ "$nccl_multi" = 1 ]; then echo "--compare nccl"; fi
}
export CUDA_DEVICE_MAX_CONNECTIONS=32
# NCCL with several ranks on one GPU: needs it enabled (2.30 on), and NVLS
# (NVLink SHARP through the NVSwitch) has nothing to do on one GPU.
[ "$nccl_multi" = 1 ] && export NCCL_MULTI_RANK_GPU_ENABLE=1
export NCCL_NVLS_ENABLE=0

step "environment (ferrocoll info --kernels)" 60 info.txt "$FC" info --kernels

bench=("$FC" bench --devices 0)
for n in 1 2 4 8; do
  # shellcheck disable=SC2046 # compare's words are meant to split
  step "bandwidth 256M-1G, $n rank(s), vs NCCL" 45 bandwidth.txt \
    "${bench[@]}" --backend cuda $(compare "$n") --ranks "$n" -b 256M -e 1G -f 2 -n 10 -w 3 -c 0 \
    --membw --json "$JSON/bw-$n.json"
done
for n in 1 2 8; do
  # shellcheck disable=SC2046
  step "small calls 8B-1M, $n rank(s), Simple" 20 latency.txt \
    env FERROCOLL_PROTO=Simple "${bench[@]}" --backend cuda $(compare "$n") --ranks "$n" \
    -b 8 -e 1M -f 4 -n 50 -w 10 -c 0 --json "$JSON/lat-simple-$n.json"
  step "small calls 8B-1M, $n rank(s), LL" 20 latency.txt \
    env FERROCOLL_PROTO=LL "${bench[@]}" --backend cuda --ll-max-bytes 1M --ranks "$n" \
    -b 8 -e 1M -f 4 -n 50 -w 10 -c 0 --json "$JSON/lat-ll-$n.json"
done
# The simulator's two assumed GPU costs (crates/topo/src/sim/cost.rs),
# measured: one rank on one channel at 256 MiB is a copy through one
# block, each byte loaded and stored once, so the block moves twice its
# algbw; 8 B on one channel at K = 1 and K = 8 differ by the instructions
# a rank runs (counted from the plan), which the extra time is spent on.
step "calibration: one block, 256 MiB" 20 bandwidth.txt \
  "${bench[@]}" --backend cuda --ranks 1 --algo ring --channels 1 -b 256M -e 256M -n 10 -w 3 -c 0 \
  --json "$JSON/cal-block.json"
for n in 1 8; do
  "$FC" plan --algo ring --ranks "$n" --channels 1 --count 2 2> /dev/null |
    sed -n 's/.*; \([0-9][0-9]*\) instructions in all.*/\1/p' > "$JSON/cal-instructions-$n.txt"
  step "calibration: one channel, 8 B, $n rank(s)" 15 latency.txt \
    env FERROCOLL_PROTO=Simple "${bench[@]}" --backend cuda --ranks "$n" --algo ring --channels 1 \
    -b 8 -e 8 -n 200 -w 20 -c 0 --json "$JSON/cal-ins-$n.json"
done
for n in 2 4 8; do
  step "checked 1K-64M, every collective, $n ranks" 40 check.txt \
    "${bench[@]}" --backend cuda --ranks "$n" --op all -b 1K -e 64M -f 16 -n 2 -w 1 -c 1
done
for size in 67108864 67108870; do # aligned, then 33554435 elements (odd)
  step "checked bf16 $size B, 4 ranks" 15 check.txt \
    "${bench[@]}" --backend cuda --ranks 4 -d bf16 -b "$size" -e "$size" -n 2 -w 1 -c 1
done
step "conformance, the failures, capture, relay" 150 conformance.txt \
  "$BUNDLE/cuda_conformance" --test-threads=1
# Both ranks see GPU 0 alone: refused because they share it, which the
# output must say (with GPU 1 visible, rank 1 would fail on a missing GPU).
refused_on_one_gpu() {
  local out rc
  out=$(CUDA_VISIBLE_DEVICES=0 "$FC" launch -n 2 -- "$FC" bench --backend cuda --from-env -b 1K -e 1K 2>&1)
  rc=$?
  echo "$out"
  [ "$rc" -ne 0 ] && grep -q 'are both on GPU' <<< "$out"
}
export -f refused_on_one_gpu
export FC
step "two processes on one GPU: refused" 20 other.txt bash -c refused_on_one_gpu
step "NCCL conformance, ranks on 1 GPU" 40 other.txt \
  "$BUNDLE/nccl_conformance" --test-threads=1

{
  echo "== summary ($((SECONDS - START)) s of $BUDGET; files in $OUT)"
  grep -hE '^(cuda driver|nvrtc|nccl|gpus|  0:) ' "$OUT/info.txt" || true
  grep -hE 'cases passed|test result' "$OUT/conformance.txt" "$OUT/other.txt" 2> /dev/null | tail -n 6
  grep -hE '^# Out of bounds' "$OUT/check.txt" 2> /dev/null | sort | uniq -c
  printf '%s\n' "${summary[@]}"
  echo
  python3 "$BUNDLE/gpu-table.py" "$JSON" 2>&1 || echo "(no table: python3 failed)"
} | tee "$OUT/summary.txt"
