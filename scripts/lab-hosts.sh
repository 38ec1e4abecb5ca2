#!/usr/bin/env bash
# Host identity across the emulated cluster (scripts/lab.sh): 2 hosts × 2
# ranks, started by hand with env:// (no multi-host launcher yet).
#   1. --transport shm across two hosts is refused on every rank, naming both
#      hosts (with plain `ip netns exec`, which shares /dev/shm, it once
#      silently worked);
#   2. the same ranks over tcp run a checked all-reduce, 0 wrong;
#   3. FERROCOLL_HOST_ID equal on both hosts does not make them one: the
#      probe files in each host's private /dev/shm cannot be read across,
#      so shm is still refused.
# Needs root, the lab's tools and a release build (FERROCOLL_BIN or
# target/release/ferrocoll). Skips (exit 0) without them unless
# FERROCOLL_REQUIRE_LAB=1. Tears the lab down on any exit.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lab-common.sh
lab_preflight hosts
bash "$lab" up 2 --rate 1gbit > /dev/null

# Run one group of 2 hosts × 2 ranks: NAME PORT TRANSPORT [VAR=VALUE...];
# every rank's output in $out/NAME.R; prints how many ranks failed.
group() {
  local name=$1 port=$2 transport=$3; shift 3
  local pids=() r
  for r in 0 1 2 3; do
    env "$@" RANK=$r WORLD_SIZE=4 LOCAL_RANK=$((r % 2)) MASTER_ADDR=198.18.0.1 \
      MASTER_PORT="$port" FERROCOLL_JOB_SECRET="lab-hosts-$$-$name" FERROCOLL_TIMEOUT_MS=20000 \
      bash "$lab" exec $((r / 2)) -- "$bin" bench --backend cpu --transport "$transport" \
      -b 4K -e 64K -f 4 -n 2 -w 1 -c 1 > "$out/$name.$r" 2>&1 &
    pids+=($!)
  done
  local failed=0
  for r in 0 1 2 3; do wait "${pids[$r]}" || failed=$((failed + 1)); done
  echo "$failed"
}

fail() { echo "lab hosts: FAILED: $*" >&2; tail -n 5 "$out"/* >&2; exit 1; }

n=$(group shm 29611 shm)
[ "$n" = 4 ] || fail "shm across hosts: $n of 4 ranks failed, want 4"
for r in 0 1 2 3; do
  grep -q "spans 2 hosts" "$out/shm.$r" || fail "rank $r's error does not name the hosts"
done
grep -q "fclab-h1" "$out/shm.0" || fail "the hosts are not named by hostname"

n=$(group tcp 29612 tcp)
[ "$n" = 0 ] || fail "tcp across hosts: $n of 4 ranks failed"
grep -qE '^# Out of bounds values : 0 OK' "$out/tcp.0" || fail "tcp: wrong values"

n=$(group same-id 29613 shm FERROCOLL_HOST_ID=one-host)
[ "$n" = 4 ] || fail "an equal FERROCOLL_HOST_ID made two hosts one ($n of 4 failed)"
grep -q "spans 2 hosts" "$out/same-id.0" || fail "equal ids: not refused as two hosts"

[ -z "$(bash "$lab" leftovers 2>/dev/null | grep -v '^lab:' || true)" ] || fail "files left in a host's /dev/shm"
bash "$lab" down --strict > /dev/null
bash "$lab" check-clean > /dev/null
echo "lab hosts: ok (shm refused across 2 hosts and with equal ids; tcp checked, 0 wrong)"
