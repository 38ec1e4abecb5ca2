#!/usr/bin/env bash
# Usage: scripts/compare-mpi.sh [--install] [--tcp] [-n RANKS] [-- BENCH_ARGS...]
#        scripts/compare-mpi.sh --hosts H [--per-host L] [--rate 1gbit] [-- BENCH_ARGS...]
#
# With --hosts: across H emulated hosts of L ranks each, under mpirun
# (scripts/compare-mpi-hosts.sh): OpenMPI's all-reduce, ferrocoll over MPI
# links and ferrocoll over its own TCP, side by side. Needs root.
#
# Runs OpenMPI's MPI_Allreduce (scripts/mpi-allreduce.c) on RANKS processes
# (default 4) over shared memory (with --tcp: over its TCP transport on
# loopback), printing an nccl-tests-style table.
# BENCH_ARGS default to "-b 4K -e 64M -f 4 -n 20 -w 5".
# The same sweep is then run with ferrocoll's multi-process transport of
# the same kind (shm, or tcp) and its in-process executor (with --membw,
# for the strict ceiling), so one run gives three tables, then a summary
# of ratios per size: our busbw over MPI's (in and out of place, threads
# and processes), MPI's time over ours (>= 1: we are no slower; processes
# and threads), and the threads' busbw over the ceiling BW·(N−1)/N² as
# their row prints it (rows past the last-level cache: against the memory
# probed between their rounds of calls).
# ferrocoll runs through `cargo run --release`, or the binary
# FERROCOLL_BIN names.
#
# OpenMPI is a comparison tool here (and, behind the `mpi` feature, a kind
# of link): nothing is installed unless --install is given (Debian:
# openmpi-bin libopenmpi-dev).
set -euo pipefail
cd "$(dirname "$0")/.."

ranks=4
install=0
transport=shm
btl=self,vader
if [[ ${1:-} == --hosts ]]; then
  exec bash scripts/compare-mpi-hosts.sh "$@"
fi
while [[ $# -gt 0 ]]; do
  case "$1" in
    --install) install=1; shift ;;
    --tcp) transport=tcp; btl=self,tcp; shift ;;
    -n) ranks="$2"; shift 2 ;;
    --) shift; break ;;
    *) sed -n '2,22s/^# \{0,1\}//p' "$0" >&2; exit 2 ;;
  esac
done
args=("$@")
[[ ${#args[@]} -gt 0 ]] || args=(-b 4K -e 64M -f 4 -n 20 -w 5)

if [[ $install == 1 ]]; then
  sudo=""; [[ $(id -u) == 0 ]] || sudo=sudo
  $sudo apt-get install -y openmpi-bin libopenmpi-dev
fi
command -v mpicc >/dev/null || { echo "mpicc not found; rerun with --install" >&2; exit 1; }

mpi_bin="${TMPDIR:-/tmp}/ferrocoll-mpi-allreduce"
mpicc -O2 -Wall -Wextra -o "$mpi_bin" scripts/mpi-allreduce.c

echo "== MPI: $(mpirun --version | head -n 1), $ranks ranks, btl $btl: ${args[*]}"
# pml ob1 is forced because Debian's build prefers UCX, which would bypass
# the btl list; "self,vader" then keeps all traffic in shared memory, and
# "self,tcp" sends it over loopback TCP.
# --allow-run-as-root is harmless for normal users and needed in containers.
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
mpirun --allow-run-as-root --oversubscribe --bind-to none -np "$ranks" \
  --mca pml ob1 --mca btl "$btl" \
  "$mpi_bin" "${args[@]}" | tee "$out/mpi"

# Wherever cargo puts the binary (CARGO_TARGET_DIR included); `launch`
# runs its own executable for a `ferrocoll` command.
if [[ -n ${FERROCOLL_BIN:-} ]]; then
  ferrocoll=("$FERROCOLL_BIN")
else
  cargo build --release -q
  ferrocoll=(cargo run --release -q --)
fi
echo "== ferrocoll, $ranks processes over $transport: ${args[*]}"
"${ferrocoll[@]}" launch -n "$ranks" -- ferrocoll bench --backend cpu \
  --transport "$transport" --op all-reduce "${args[@]}" | sed 's/^\[rank 0\] //' | tee "$out/procs"
echo "== ferrocoll, $ranks ranks in one process: ${args[*]}"
"${ferrocoll[@]}" bench --backend cpu --ranks "$ranks" --op all-reduce --membw "${args[@]}" | tee "$out/threads"

cores=$(nproc)
note=""; [[ $ranks -gt $cores ]] && note=" (oversubscribed: $ranks ranks on $cores cores)"
echo "== summary, $ranks ranks$note: ratios from this run"
ceiling=$(awk '/in-process ceiling/ {print $(NF-1)}' "$out/threads")
awk -v ceiling="${ceiling:-0}" -v kind="$transport" '
  FNR == 1 { file++ }
  /^ *[0-9]/ {
    if (file == 1) { mt[$1] = $5; mo[$1] = $7; mi[$1] = $12; sizes[++n] = $1 }
    if (file == 2) { pt[$1] = $6; so[$1] = $8; si[$1] = $12 }
    if (file == 3) {
      tt[$1] = $6; to[$1] = $8; ti[$1] = $12
      for (i = 13; i < NF; i++) if ($i ~ /x$/ && $(i + 1) == "ceiling") tc[$1] = substr($i, 1, length($i) - 1)
    }
  }
  function r(a, b) { return b > 0 ? sprintf("%.2f", a / b) : "-" }
  END {
    printf "# %10s  %9s %9s  %9s %9s  %9s %9s  %9s\n", "size", "thr/MPI", "thr/MPI", kind "/MPI", kind "/MPI", "MPItime/", "MPItime/", "thr/ceil"
    printf "# %10s  %9s %9s  %9s %9s  %9s %9s  %9s\n", "(B)", "oop", "in-place", "oop", "in-place", kind " oop", "thr oop", "oop"
    for (k = 1; k <= n; k++) {
      s = sizes[k]
      printf "  %10s  %9s %9s  %9s %9s  %9s %9s  %9s\n", s, r(to[s], mo[s]), r(ti[s], mi[s]), r(so[s], mo[s]), r(si[s], mi[s]), r(mt[s], pt[s]), r(mt[s], tt[s]), (s in tc ? tc[s] : "-")
    }
    printf "# thr/ceil: the threads'"'"' row against BW(N-1)/N^2, BW probed between the row'"'"'s rounds of calls past the last-level cache, else before or after the sweep (whose first probe put the ceiling at %s GB/s)\n", ceiling
  }' "$out/mpi" "$out/procs" "$out/threads"
