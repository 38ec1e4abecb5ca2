#!/usr/bin/env bash
# Usage: scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]
#
# Runs the cargo-fuzz targets in fuzz/ (libFuzzer, AddressSanitizer) for
# SECONDS_PER_TARGET each (default 300), seeding every corpus with the
# project's valid files so mutations start from real inputs. Needs a
# nightly toolchain and `cargo install cargo-fuzz`. Prints, per target,
# the executions, the corpus it grew and whether it found anything; a
# crashing input lands in fuzz/artifacts/<target>/ — keep it as a
# regression test before fixing.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-300}
shift || true
targets=("$@")
[[ ${#targets[@]} -gt 0 ]] || targets=(schedule_json topology_json nvidia_smi nccl_xml msccl_xml plan_json store_protocol tcp_frames)

seed() {
  local target=$1 dir=fuzz/corpus/$1
  mkdir -p "$dir"
  case $target in
    schedule_json)
      cp examples/schedules/*.json "$dir"/
      for algo in ring tree direct halving-doubling; do
        for n in 2 3 4 5 8; do
          cargo run -q --release -- schedule --algo "$algo" --op all-reduce --ranks "$n" --json \
            >"$dir/$algo-$n.json" 2>/dev/null || rm -f "$dir/$algo-$n.json"
        done
      done ;;
    topology_json)
      for p in $(cargo run -q --release -- topo --list 2>/dev/null | awk 'NF{print $1}'); do
        cargo run -q --release -- topo --preset "$p" --json >"$dir/$p.json" 2>/dev/null || rm -f "$dir/$p.json"
      done ;;
    plan_json)
      for algo in ring tree direct halving-doubling; do
        for n in 2 3 5; do
          cargo run -q --release -- plan --algo "$algo" --op all-reduce --ranks "$n" --count 37 \
            --max-chunk-bytes 64 --json >"$dir/$algo-$n.json" 2>/dev/null || rm -f "$dir/$algo-$n.json"
        done
      done ;;
    nvidia_smi) cp crates/topo/tests/fixtures/smi/*.txt "$dir"/ ;;
    nccl_xml) cp crates/topo/tests/fixtures/nccl_xml/*.xml "$dir"/ ;;
    msccl_xml) cp crates/core/tests/fixtures/msccl/*.xml "$dir"/ ;;
    # The wire protocols start from nothing: libFuzzer finds the magic
    # bytes and length prefixes by itself within seconds.
    store_protocol | tcp_frames) ;;
  esac
}

cd fuzz
cargo +nightly fuzz build --release >/dev/null
cd ..
for t in "${targets[@]}"; do
  seed "$t"
  log=fuzz/$t.log
  set +e
  (cd fuzz && cargo +nightly fuzz run --release "$t" "corpus/$t" -- \
    -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1) >"$log" 2>&1
  rc=$?
  set -e
  execs=$(grep -m1 -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo "?")
  speed=$(grep -m1 -o 'stat::average_exec_per_sec: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo "?")
  corpus=$(ls "fuzz/corpus/$t" | wc -l)
  found=$(ls "fuzz/artifacts/$t" 2>/dev/null | wc -l)
  printf '%-14s %6ss  execs %10s  (%s/s)  corpus %5s  findings %s  rc %s\n' \
    "$t" "$seconds" "$execs" "$speed" "$corpus" "$found" "$rc"
done
