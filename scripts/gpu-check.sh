#!/usr/bin/env bash
# GPU checks of the CUDA executor, for a machine with a GPU but no Rust.
#
#   scripts/gpu-check.sh --build   (here) build the release CLI and the CUDA
#                                  conformance test into target/gpu-bundle
#   bash scripts/gpu-check.sh      (on the GPU machine, carrying
#                                  target/gpu-bundle) run everything and
#                                  print a short table last
#
# What it runs: nvidia-smi topo -m read back by `ferrocoll topo --smi`;
# NVML discovery and the measured P2P probe (`topo --discover --probe`);
# the conformance kit on the CUDA executor (1–8 ranks on device 0, every
# algorithm and collective, every dtype and op, the host relay) with
# FERROCOLL_REQUIRE_GPU=1 so nothing skips; the kit on NCCL; and
# `bench --backend cuda --compare nccl` all-reduce, 1 MiB..1 GiB, with 2, 4
# and 8 ranks on one GPU, beside the bound a device-to-device copy measured
# in the same run allows, and NCCL's busbw on the same data.
set -uo pipefail
cd "$(dirname "$0")/.."
BUNDLE=target/gpu-bundle

if [ "${1:-}" = "--build" ]; then
  set -e
  cargo build --release -q
  mkdir -p "$BUNDLE"
  for t in cuda_conformance nccl_conformance; do
    cargo test --release -q --workspace --no-run --message-format=json-render-diagnostics \
      | grep -o "\"executable\":\"[^\"]*$t[^\"]*\"" | head -n 1 | cut -d'"' -f4 > /tmp/ferrocoll-test-path
    cp "$(cat /tmp/ferrocoll-test-path)" "$BUNDLE/$t"
  done
  cp target/release/ferrocoll "$BUNDLE/"
  # The device tool carries at most 64 MiB: drop the debug line tables.
  command -v strip > /dev/null && strip "$BUNDLE/ferrocoll" "$BUNDLE/cuda_conformance" "$BUNDLE/nccl_conformance"
  cp cuda/reduce.cu "$BUNDLE/"
  ls -la "$BUNDLE"
  exit 0
fi

OUT="${OUT:-/tmp/gpu-check}"
mkdir -p "$OUT"
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  [ -d "$d" ] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
export FERROCOLL_CUDA_INCLUDE="${FERROCOLL_CUDA_INCLUDE:-/usr/local/cuda/include}"
export FERROCOLL_REQUIRE_GPU=1
status=()

echo "== nvidia-smi topo -m, read back"
nvidia-smi topo -m > "$OUT/smi.txt" 2>&1
"$BUNDLE/ferrocoll" topo --smi "$OUT/smi.txt" > "$OUT/topo_smi.txt" 2>&1
status+=("topo --smi: rc $?")

echo "== NVML discovery and the measured probe"
timeout 120 "$BUNDLE/ferrocoll" topo --discover --probe > "$OUT/topo_probe.txt" 2>&1
status+=("topo --discover --probe: rc $?")
tail -n 20 "$OUT/topo_probe.txt"

echo "== conformance kit on the CUDA executor"
timeout 300 "$BUNDLE/cuda_conformance" --test-threads=1 > "$OUT/conformance.txt" 2>&1
conformance=$?
status+=("conformance: rc $conformance")
grep -E "test |cases passed|panicked|SKIPPED" "$OUT/conformance.txt" | tail -n 12

echo "== conformance kit on NCCL (several ranks on one GPU need NCCL >= 2.30)"
export NCCL_MULTI_RANK_GPU_ENABLE=1
timeout 120 "$BUNDLE/nccl_conformance" --test-threads=1 > "$OUT/nccl_conformance.txt" 2>&1
status+=("nccl conformance: rc $?")
grep -E "test |cases passed|panicked|SKIPPED" "$OUT/nccl_conformance.txt" | tail -n 4

echo "== bench --backend cuda --compare nccl, all-reduce, ranks on device 0"
for n in 2 4 8; do
  timeout 150 "$BUNDLE/ferrocoll" bench --backend cuda --compare nccl --devices 0 --ranks "$n" \
    -b 1M -e 1G -f 4 -n 10 -w 3 --membw > "$OUT/bench_$n.txt" 2>&1 \
    || timeout 150 "$BUNDLE/ferrocoll" bench --backend cuda --devices 0 --ranks "$n" \
      -b 1M -e 1G -f 4 -n 10 -w 3 --membw > "$OUT/bench_$n.txt" 2>&1
  status+=("bench $n ranks: rc $?")
done

echo
echo "== summary"
printf '%s\n' "${status[@]}"
echo
echo "ranks        size   busbw(GB/s)   bound(GB/s)   busbw/bound   #wrong   (ferrocoll rows, then NCCL's)"
for n in 2 4 8; do
  f="$OUT/bench_$n.txt"
  bound=$(grep -o 'at n=[0-9]*: [0-9.]* GB/s' "$f" | awk '{print $3}')
  grep -E '^ +[0-9]+ ' "$f" | awk -v n="$n" -v b="${bound:-0}" \
    '{ r = (b > 0) ? $8 / b : 0; printf "%5d %11d %13.1f %13.1f %13.3f %8d\n", n, $1, $8, b, r, $9 }'
  grep -E '^# +[0-9]+ B: ferrocoll' "$f" || true
done
