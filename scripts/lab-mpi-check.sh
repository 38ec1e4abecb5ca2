#!/usr/bin/env bash
# MPI links across the emulated cluster (scripts/lab-mpi.sh): 2 hosts × 2
# ranks started by one mpirun from inside host 0.
#   1. every collective, checked, over shared memory inside each host and
#      MPI point-to-point between them, 0 wrong;
#   2. a rank of host 1 killed mid-run: mpirun exits non-zero and nothing
#      is left — no process of the job, no file in any host's /dev/shm —
#      and the survivors' typed errors that reached mpirun's output are
#      counted. Across hosts OpenMPI's TCP transport may end a survivor
#      itself when its peer hangs up, and mpirun may drop the late output
#      of a job it is killing; every survivor's typed error is asserted on
#      one host, in tests/cli_mpi.rs.
# Needs root, the lab's tools, OpenMPI and a ferrocoll built with the
# `mpi` feature (FERROCOLL_BIN). Skips (exit 0) without them unless
# FERROCOLL_REQUIRE_LAB=1. Tears the lab down on any exit.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lab-common.sh
lab_preflight mpi
command -v mpirun > /dev/null || lab_skip "no mpirun (Debian: openmpi-bin)"
"$bin" bench --help | grep -q -- '--net' || lab_skip "$bin has no --net"
trap 'bash scripts/lab-mpi.sh down > /dev/null 2>&1 || true; rm -rf "$out"' EXIT
bash scripts/lab-mpi.sh up 2 --rate 1gbit

fail() { echo "lab mpi: FAILED: $*" >&2; tail -n 20 "$out"/* >&2; exit 1; }

export FERROCOLL_TIMEOUT_MS=30000
bash scripts/lab-mpi.sh run 2 -- "$bin" bench --backend cpu --transport auto --op all \
  -d float,int8 -o sum,max -b 1K -e 256K -f 16 -n 2 -w 1 > "$out/check" 2>&1 \
  || fail "the checked run failed"
grep -aq 'processes over shm inside each of 2 hosts, mpi across' "$out/check" || fail "not over MPI across hosts"
grep -aq 'Out of bounds values : 0 OK' "$out/check" || fail "wrong values"

# A long run, marked by its job secret; kill rank 3 (on host 1) once every
# rank formed the group.
mark="lab-mpi-$$-$RANDOM"
FERROCOLL_JOB_SECRET=$mark bash scripts/lab-mpi.sh run 2 -x FERROCOLL_JOB_SECRET -- "$bin" bench \
  --backend cpu --transport auto -b 4M -e 4M -n 1000000 -w 0 -c 0 > "$out/killed" 2>&1 &
job=$!
ranks() { grep -lsa "FERROCOLL_JOB_SECRET=$mark" /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3 || true; }
rank_of() { { tr '\0' '\n' < "/proc/$1/environ"; } 2>/dev/null | sed -n 's/^OMPI_COMM_WORLD_RANK=//p'; }
victim=""
for _ in $(seq 1 300); do
  sleep 0.1
  pids=$(for p in $(ranks); do if [ -n "$(rank_of "$p")" ]; then echo "$p"; fi; done)
  if [ "$(echo "$pids" | grep -c . || true)" = 4 ]; then
    for p in $pids; do [ "$(rank_of "$p")" = 3 ] && victim=$p; done
    break
  fi
done
[ -n "$victim" ] || fail "four ranks did not start"
sleep 3
kill -9 "$victim"
rc=0
timeout 60 tail --pid="$job" -f /dev/null || fail "mpirun did not end within 60 s"
wait "$job" || rc=$?
[ "$rc" != 0 ] || fail "mpirun exited 0 after a rank was killed"
typed=0
for r in 0 1 2; do
  if grep -aq "error: rank $r: .*SIGTERM from the launcher" "$out/killed"; then typed=$((typed + 1)); fi
done
sleep 1
[ -z "$(ranks)" ] || fail "processes of the job left: $(ranks)"
[ -z "$(bash scripts/lab.sh leftovers 2>/dev/null | grep -v '^lab:' || true)" ] || fail "files left in a host's /dev/shm"
bash scripts/lab-mpi.sh down --strict > /dev/null
bash scripts/lab.sh check-clean > /dev/null
echo "lab mpi: ok (2 hosts × 2 ranks over shm + MPI, 0 wrong; rank 3 killed: mpirun exit $rc, nothing left, $typed of 3 survivors' typed errors in its output)"
