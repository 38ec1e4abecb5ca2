#!/usr/bin/env bash
# One prepared GPU check for a single-GPU machine (one H200, CUDA 13 driver,
# NCCL in some Python environment, no Rust toolchain): binaries are built
# here and carried, the run fits in 7 minutes, every step has its own
# timeout, at most 7 files land in $OUT, and a summary table comes last.
#
#   scripts/gpu-check.sh --build   (here) build the release CLI and the CUDA
#                                  and NCCL conformance tests, stripped, into
#                                  target/gpu-bundle (or $BUNDLE)
#   bash scripts/gpu-check.sh      (on the GPU machine, carrying the bundle)
#
# Steps (file), most important first (a step that would overrun the budget
# is skipped and says so):
#   1 environment: `ferrocoll info`, `nvidia-smi topo -m` read back (info.txt)
#   2 conformance kit on the device interpreter (executor v2), K ranks on
#     GPU 0, plus its mismatch, silent-rank and graph-replay tests
#     (conformance.txt)
#   3 latency floor 8 B - 64 KiB, 1, 2 and 8 ranks, v2 beside NCCL; then
#     8 B - 1 MiB all bulk and all LL, where the protocols cross (latency.txt)
#   4 bandwidth 16 - 256 MiB, 2, 4 and 8 ranks, v2 against the device copy
#     bound measured in the same run, beside NCCL; v1 at 8 ranks beside it
#     (bandwidth.txt)
#   5 bf16 at aligned and unaligned sizes on v2 (bf16.txt)
#   6 a count above 2^31 elements on v2; two processes on the one GPU
#     joining a v2 group must be refused with the reason (large.txt)
#   7 NCCL with several ranks on the GPU (NCCL >= 2.30 and
#     NCCL_MULTI_RANK_GPU_ENABLE=1): its conformance and bench (nccl.txt);
#     then executor v1's conformance (conformance.txt)
set -uo pipefail
cd "$(dirname "$0")/.."
BUNDLE="${BUNDLE:-target/gpu-bundle}"

if [ "${1:-}" = "--build" ]; then
  set -e
  cargo build --release -q
  mkdir -p "$BUNDLE"
  for t in cuda_conformance nccl_conformance; do
    path=$(cargo test --release -q --workspace --no-run --message-format=json-render-diagnostics \
      | grep -o "\"executable\":\"[^\"]*$t[^\"]*\"" | head -n 1 | cut -d'"' -f4)
    cp "$path" "$BUNDLE/$t"
  done
  cp "${CARGO_TARGET_DIR:-target}/release/ferrocoll" "$BUNDLE/"
  # What travels to the device machine is capped at 64 MiB: no debug info.
  command -v strip > /dev/null && strip "$BUNDLE"/ferrocoll "$BUNDLE"/*_conformance
  cp cuda/reduce.cu cuda/interpret.cu "$BUNDLE/"
  du -sh "$BUNDLE"
  exit 0
fi

OUT="${OUT:-/tmp/gpu-check}"
mkdir -p "$OUT"
START=$SECONDS
BUDGET="${GPU_CHECK_BUDGET:-400}"
FC="$BUNDLE/ferrocoll"
summary=()

# A step gets its own limit, never more than what is left of the budget.
step() {
  local name=$1 limit=$2 file=$3
  shift 3
  local left=$((BUDGET - (SECONDS - START)))
  [ "$limit" -gt "$left" ] && limit=$left
  if [ "$limit" -lt 5 ]; then
    summary+=("$(printf '%-34s %s' "$name" "skipped: out of time")")
    return
  fi
  local t0=$SECONDS
  echo "== $name (limit ${limit}s)" | tee -a "$OUT/$file"
  timeout --kill-after=5 "$limit" "$@" >> "$OUT/$file" 2>&1
  local rc=$?
  local verdict="rc $rc"
  [ "$rc" -eq 124 ] && verdict="timed out"
  summary+=("$(printf '%-34s %-10s %4ds  %s' "$name" "$verdict" $((SECONDS - t0)) "$file")")
}

# Libraries from Python environments that are not on PATH (an unactivated
# venv or conda env): the binaries search PATH's Pythons themselves.
find_lib() {
  timeout 20 find / -xdev -maxdepth 9 -name "$1" -path '*nvidia*' 2> /dev/null | head -n 1
}
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  [ -d "$d" ] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
if ! "$FC" info --no-measure 2> /dev/null | grep -q '^nccl  .* at /'; then
  nccl=$(find_lib 'libnccl.so.2')
  [ -n "$nccl" ] && export FERROCOLL_NCCL_LIB="$nccl"
fi
if ! "$FC" info --no-measure 2> /dev/null | grep -q '^nvrtc .* at /'; then
  nvrtc=$(find_lib 'libnvrtc.so.1*')
  [ -n "$nvrtc" ] && export LD_LIBRARY_PATH="$(dirname "$nvrtc")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
export FERROCOLL_CUDA_INCLUDE="${FERROCOLL_CUDA_INCLUDE:-/usr/local/cuda/include}"
export FERROCOLL_REQUIRE_GPU=1
export NCCL_MULTI_RANK_GPU_ENABLE=1

step "environment (ferrocoll info)" 30 info.txt "$FC" info
step "nvidia-smi topo -m, read back" 15 info.txt bash -c \
  'nvidia-smi topo -m > "$0/smi.tmp"; cat "$0/smi.tmp"; "$1" topo --smi "$0/smi.tmp"; rc=$?; rm -f "$0/smi.tmp"; exit $rc' \
  "$OUT" "$FC"

step "conformance, device interpreter" 110 conformance.txt \
  "$BUNDLE/cuda_conformance" --test-threads=1 interpreter

bench=("$FC" bench --devices 0)
for n in 1 2 8; do
  step "v2 latency 8B-64K, $n rank(s)" 20 latency.txt \
    "${bench[@]}" --backend cuda-v2 --compare nccl --ranks "$n" -b 8 -e 64K -f 8 -n 20 -w 5
done
step "v2 latency 8B-1M, 8 ranks, bulk only" 20 latency.txt \
  "${bench[@]}" --backend cuda-v2 --ll-max-bytes 0 --ranks 8 -b 8 -e 1M -f 8 -n 20 -w 5
step "v2 latency 8B-1M, 8 ranks, LL to 1M" 20 latency.txt \
  "${bench[@]}" --backend cuda-v2 --ll-max-bytes 1M --ranks 8 -b 8 -e 1M -f 8 -n 20 -w 5
for n in 2 4 8; do
  step "v2 bandwidth 16M-256M, $n ranks" 35 bandwidth.txt \
    "${bench[@]}" --backend cuda-v2 --compare nccl --ranks "$n" --channels $((32 / n)) \
    -b 16M -e 256M -f 4 -n 5 -w 2 --membw
done
step "v1 bandwidth 16M-256M, 8 ranks" 35 bandwidth.txt \
  "${bench[@]}" --backend cuda --ranks 8 -b 16M -e 256M -f 4 -n 5 -w 2
step "v2 bf16 aligned, 4 ranks" 15 bf16.txt \
  "${bench[@]}" --backend cuda-v2 --ranks 4 --channels 8 -d bf16 -b 64M -e 64M -n 5 -w 1
step "v2 bf16 unaligned, 4 ranks" 15 bf16.txt \
  "${bench[@]}" --backend cuda-v2 --ranks 4 --channels 8 -d bf16 -b 67108870 -e 67108870 -n 5 -w 1
step "v2 count > 2^31 (uint8, 2 ranks)" 40 large.txt \
  "${bench[@]}" --backend cuda-v2 --ranks 2 --channels 16 -d uint8 -b 2200000000 -e 2200000000 -n 1 -w 0

step "v2 across processes on 1 GPU: refused" 15 large.txt \
  "$FC" launch -n 2 -- "$FC" bench --backend cuda-v2 --from-env -b 1K -e 1K
step "NCCL conformance, ranks on 1 GPU" 40 nccl.txt \
  "$BUNDLE/nccl_conformance" --test-threads=1
step "NCCL bench, 4 ranks on 1 GPU" 25 nccl.txt \
  "${bench[@]}" --backend nccl --ranks 4 -b 8 -e 256M -f 16 -n 5 -w 2
step "conformance, CUDA executor v1" 60 conformance.txt \
  "$BUNDLE/cuda_conformance" --test-threads=1 --skip interpreter

echo
echo "== summary ($((SECONDS - START)) s; files in $OUT)"
grep -E '^(cuda driver|nvrtc|nccl|gpus) ' "$OUT/info.txt" || true
grep -hE 'cases passed|test result' "$OUT/conformance.txt" "$OUT/nccl.txt" 2> /dev/null | tail -n 4
printf '%s\n' "${summary[@]}"
echo
echo "rows: size, time (us), busbw (GB/s), #wrong (out of place); the bound and NCCL's figures as bench prints them"
for f in latency bandwidth bf16 large; do
  echo "-- $f"
  grep -hE '^== |ceiling|B: ferrocoll|^ +[0-9]+ ' "$OUT/$f.txt" 2> /dev/null \
    | awk '$1 ~ /^[0-9]+$/ { printf "  %12s B %11s us %9s GB/s  wrong %s\n", $1, $6, $8, $9; next } { print }'
done | head -n 90
