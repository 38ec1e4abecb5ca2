#!/usr/bin/env bash
# Jobs across the emulated cluster (scripts/lab.sh), each host started by its
# own `ferrocoll launch --nnodes 2 --node-rank K --nproc-per-node 2`, and the
# faults of a real cluster. Every case must end with non-zero exits on every
# host (but the healthy ones), no process of the job left on any host and no
# file left in any host's /dev/shm, and (for faults) the lost host named.
#
#   0. a healthy job: checked all-reduce, shm inside hosts, tcp across, 0 wrong
#   1. a host killed (its pid namespace) mid-run: noticed within 5 s
#   2. a host's link down mid-call: every launcher fails within the bound
#   3. a link flap shorter than the bound: the job completes, 0 wrong
#   4. the store's host (node 0) killed: the other fails within the bound
#   5. a node that never arrives: named
#   6. a one-way partition (iptables): only where iptables is installed
#
# Needs root, the lab's tools and a release build (FERROCOLL_BIN or
# target/release/ferrocoll). Skips (exit 0) without them unless
# FERROCOLL_REQUIRE_LAB=1. Tears the lab down on any exit. About 60 s.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lab-common.sh
lab_preflight faults
fail() { echo "lab faults: FAILED: $*" >&2; tail -n 8 "$out"/*.log >&2 || true; exit 1; }
port=29800

# start NAME NODES... -- CMD...: start the launchers of nodes NODES (of 2) in the
# background; their logs in $out/NAME.K.log, their pids in $out/NAME.K.pid.
start() {
  local name=$1; shift
  local nodes=()
  while [ "$1" != -- ]; do nodes+=("$1"); shift; done
  shift
  port=$((port + 1))
  local k
  for k in "${nodes[@]}"; do
    rm -f "$out/$name.$k.rc"
    (
      rc=0
      FERROCOLL_JOB_SECRET="lab-faults-$$-$name" FERROCOLL_TIMEOUT_MS=60000 \
        bash "$lab" exec "$k" -- "$bin" launch --nnodes 2 --node-rank "$k" --nproc-per-node 2 \
        --rdzv-endpoint "198.18.0.1:$port" --rdzv-timeout "${RDZV:-20}" -- "$@" \
        > "$out/$name.$k.log" 2>&1 || rc=$?
      echo "$rc" > "$out/$name.$k.rc"
    ) &
    echo $! > "$out/$name.$k.pid"
  done
}

# finish NAME K LIMIT: wait up to LIMIT seconds for node K's launcher; print its
# exit code (124 if it had to be killed). Runs in a subshell ($(...)), so it
# reads the code the launcher's own subshell left instead of `wait`ing.
finish() {
  local rc="$out/$1.$2.rc" t=0
  until [ -s "$rc" ]; do
    sleep 0.1; t=$((t + 1))
    if [ "$t" -ge $(($3 * 10)) ]; then
      pkill -9 -P "$(cat "$out/$1.$2.pid")" 2>/dev/null || true
      echo 124; return
    fi
  done
  cat "$rc"
}

# running NAME: both launchers printed their banner (the ranks run).
running() {
  local t=0
  until grep -q pids "$out/$1.0.log" 2>/dev/null && grep -q pids "$out/$1.1.log" 2>/dev/null; do
    sleep 0.1; t=$((t + 1)); [ "$t" -lt 300 ] || fail "$1: the job never started"
  done
}

# clean NAME: nothing of the job left on a live host, nothing in its /dev/shm.
clean() {
  local k
  for k in 0 1; do
    if bash "$lab" status 2>/dev/null | awk -v k="$k" '$1 == k' | grep -q 'alive.*alive'; then
      ! bash "$lab" exec "$k" -- pgrep -f "lab-faults-$$-$1" > /dev/null 2>&1 \
        || fail "$1: processes of the job left on host $k"
      ! bash "$lab" exec "$k" -- sh -c 'ls -A /dev/shm | grep -q .' \
        || fail "$1: files left in host $k's /dev/shm"
    fi
  done
}

long=(ferrocoll bench --transport auto -b 4M -e 4M -n 100000 -w 0 -c 0)
checked=(ferrocoll bench --transport auto -b 4K -e 4M -f 8 -n 3 -w 1 -c 1)

bash "$lab" up 2 --rate 1gbit > /dev/null

# 0. healthy
start healthy 0 1 -- "${checked[@]}"
[ "$(finish healthy 0 120)" = 0 ] && [ "$(finish healthy 1 120)" = 0 ] || fail "healthy: a launcher failed"
grep -q 'shm inside each of 2 hosts' "$out/healthy.0.log" || fail "healthy: not shm inside hosts"
grep -q 'Out of bounds values : 0 OK' "$out/healthy.0.log" || fail "healthy: wrong values"
clean healthy
echo "lab faults: healthy job across 2 hosts: 0 wrong"

# host_killed NAME VICTIM WATCHER LIMIT WHAT: kill host VICTIM's pid namespace
# mid-run; node WATCHER must fail within LIMIT seconds, naming it; then the
# lab is rebuilt (a killed host stays dead).
host_killed() {
  local name=$1 victim=$2 watcher=$3 limit=$4 what=$5
  start "$name" 0 1 -- "${long[@]}"
  running "$name"; sleep 2
  local t0 rc dt
  t0=$(date +%s.%N)
  bash "$lab" fault kill "$victim" > /dev/null
  rc=$(finish "$name" "$watcher" 15)
  dt=$(echo "$(date +%s.%N) - $t0" | bc)
  [ "$rc" = 1 ] || fail "$what: node $watcher exited $rc"
  awk -v d="$dt" -v l="$limit" 'BEGIN { exit !(d <= l) }' || fail "$what: node $watcher took ${dt}s"
  grep -q "node $victim\|host $victim" "$out/$name.$watcher.log" || fail "$what: the host is not named"
  finish "$name" "$victim" 5 > /dev/null
  clean "$name"
  echo "lab faults: $what: node $watcher failed after ${dt}s, naming it"
  bash "$lab" down > /dev/null; bash "$lab" up 2 --rate 1gbit > /dev/null
}

# 1. a host killed mid-run
host_killed killed 1 0 5 "host 1 killed"

# 2. a host's link down mid-call
start linkdown 0 1 -- "${long[@]}"
running linkdown; sleep 2
t0=$(date +%s.%N)
bash "$lab" fault link-down 1 > /dev/null
rc0=$(finish linkdown 0 20); rc1=$(finish linkdown 1 20)
dt=$(echo "$(date +%s.%N) - $t0" | bc)
[ "$rc0" = 1 ] && [ "$rc1" = 1 ] || fail "link down: exits $rc0 and $rc1, want 1 and 1"
awk -v d="$dt" 'BEGIN { exit !(d <= 8) }' || fail "link down: the launchers took ${dt}s"
grep -q 'node 1\|host 1' "$out/linkdown.0.log" || fail "link down: node 0 does not name node 1"
grep -q 'node 0\|host 0' "$out/linkdown.1.log" || fail "link down: node 1 does not name node 0"
bash "$lab" fault link-up 1 > /dev/null
clean linkdown
echo "lab faults: host 1's link down: both sides failed within ${dt}s, each naming the other"

# 3. a flap shorter than the bound
start flap 0 1 -- ferrocoll bench --transport auto -b 16M -e 16M -n 20 -w 1 -c 1
running flap; sleep 3
bash "$lab" fault link-down 1 > /dev/null; sleep 0.5; bash "$lab" fault link-up 1 > /dev/null
rc0=$(finish flap 0 120); rc1=$(finish flap 1 120)
[ "$rc0" = 0 ] && [ "$rc1" = 0 ] || fail "flap: exits $rc0 and $rc1, want 0 and 0"
grep -q 'Out of bounds values : 0 OK' "$out/flap.0.log" || fail "flap: wrong values"
clean flap
echo "lab faults: a 0.5 s link flap: the job completed, 0 wrong"

# 4. the store's host killed
host_killed storehost 0 1 6 "host 0 (the store's) killed"

# 5. a node that never arrives
RDZV=3 start missing 0 -- true
rc=$(finish missing 0 20)
[ "$rc" != 0 ] || fail "missing node: node 0 succeeded"
grep -q 'node ranks \[1\] of 2 never arrived' "$out/missing.0.log" || fail "missing node: not named"
echo "lab faults: a node that never arrives: named"

# 6. a one-way partition
if bash "$lab" exec 1 -- sh -c 'command -v iptables' > /dev/null 2>&1; then
  start oneway 0 1 -- "${long[@]}"
  running oneway; sleep 2
  bash "$lab" fault drop-in 1 > /dev/null
  rc0=$(finish oneway 0 20); rc1=$(finish oneway 1 20)
  [ "$rc0" = 1 ] && [ "$rc1" = 1 ] || fail "one-way partition: exits $rc0 and $rc1"
  grep -q 'node 1\|host 1' "$out/oneway.0.log" || fail "one-way partition: node 0 does not name node 1"
  grep -q 'node 0\|host 0' "$out/oneway.1.log" || fail "one-way partition: node 1 does not name node 0"
  bash "$lab" fault heal 1 > /dev/null
  clean oneway
  echo "lab faults: one-way partition: both sides failed, each naming the other"
else
  echo "lab faults: one-way partition: skipped (no iptables on this machine)"
fi

[ -z "$(bash "$lab" leftovers 2>/dev/null | grep -v '^lab:' || true)" ] || fail "files left in a host's /dev/shm"
bash "$lab" down --strict > /dev/null
bash "$lab" check-clean > /dev/null
echo "lab faults: ok"
