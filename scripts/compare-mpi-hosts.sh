#!/usr/bin/env bash
# `scripts/compare-mpi.sh --hosts H` (see there): all-reduce f32 across the
# emulated cluster's hosts (scripts/lab-mpi.sh), every run under one
# mpirun per variant, side by side:
#   1. OpenMPI's MPI_Allreduce (scripts/mpi-allreduce.c): coll tuned; tuned
#      with a 1 MiB TCP eager limit; HAN (its simple all-reduce: the
#      pipelined one crashes in 4.1.4 here);
#   2. ferrocoll over MPI links (shared memory inside a host, MPI across),
#      ring and auto (the hierarchical schedule across equal hosts);
#   3. ferrocoll over its own transports (shared memory inside, TCP
#      across), ring and auto — the same mpirun bootstrap.
# Then per size the ratios that matter: OpenMPI's best time over
# ferrocoll-over-MPI's (≥ 1: we are faster) and ferrocoll over MPI links
# against over its own TCP (1.00: the link kind costs nothing).
#
#   scripts/compare-mpi-hosts.sh --hosts H --per-host L [--rate 1gbit] [-- BENCH_ARGS...]
#
# BENCH_ARGS default to "-b 1M -e 64M -f 4 -n 5 -w 3". Needs root, the
# lab's tools, OpenMPI and a ferrocoll built with `--features mpi`
# (FERROCOLL_BIN, else built here).
set -euo pipefail
cd "$(dirname "$0")/.."
hosts=2 per_host=2 rate=1gbit
while [[ $# -gt 0 ]]; do
  case $1 in
    --hosts) hosts=$2; shift 2 ;;
    --per-host) per_host=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --) shift; break ;;
    *) sed -n '2,20s/^# \{0,1\}//p' "$0" >&2; exit 2 ;;
  esac
done
args=("$@")
[[ ${#args[@]} -gt 0 ]] || args=(-b 1M -e 64M -f 4 -n 5 -w 3)
command -v mpicc > /dev/null || { echo "mpicc not found (Debian: openmpi-bin libopenmpi-dev)" >&2; exit 1; }
if [[ -z ${FERROCOLL_BIN:-} ]]; then
  cargo build --release -q --features mpi
  FERROCOLL_BIN=target/release/ferrocoll
fi
bin=$(realpath "$FERROCOLL_BIN")
out=$(mktemp -d /tmp/ferrocoll-compare-hosts.XXXXXX)
mpi_bin="$out/mpi-allreduce"
mpicc -O2 -Wall -Wextra -o "$mpi_bin" scripts/mpi-allreduce.c
cleanup() { bash scripts/lab-mpi.sh down --strict > /dev/null 2>&1 || true; rm -rf "$out"; }
trap cleanup EXIT
bash scripts/lab-mpi.sh up "$hosts" --rate "$rate"

# NAME MPIRUN_ARGS... -- CMD...: one variant, its table kept as $out/NAME.
variant() {
  local name=$1
  shift
  echo "== $name"
  bash scripts/lab-mpi.sh run "$per_host" "$@" 2>&1 | tr -d '\0' | tee "$out/$name" | grep -E '^ *[0-9]|rror|wrong|Out of bounds' || true
}
eager=(--mca btl_tcp_eager_limit 1048576 --mca btl_tcp_rndv_eager_limit 1048576)
han=(--mca coll_han_priority 100 --mca coll_han_use_simple_allreduce 1)
variant mpi-tuned -- "$mpi_bin" "${args[@]}"
variant mpi-tuned-eager "${eager[@]}" -- "$mpi_bin" "${args[@]}"
variant mpi-han "${han[@]}" -- "$mpi_bin" "${args[@]}"
for net in mpi tcp; do
  for algo in ring auto; do
    variant "fc-$net-$algo" -- "$bin" bench --backend cpu --transport auto --net "$net" \
      --algo "$algo" --op all-reduce "${args[@]}"
  done
done

echo "== summary: $hosts hosts × $per_host ranks, $rate per host link, all-reduce f32, out-of-place µs (every row checked)"
awk -v files="mpi-tuned mpi-tuned-eager mpi-han fc-mpi-ring fc-mpi-auto fc-tcp-ring fc-tcp-auto" '
  BEGIN { n = split(files, name, " ") }
  FNR == 1 { f++ }
  /^ *[0-9]/ {
    mpi = (f <= 3)
    t[f, $1] = mpi ? $5 : $6
    bad[f] += mpi ? $8 + $13 : $9 + $13
    if (!($1 in seen)) { seen[$1] = 1; size[++m] = $1 }
  }
  function min3(a, b, c) { x = a; if (b > 0 && (x == 0 || b < x)) x = b; if (c > 0 && (x == 0 || c < x)) x = c; return x }
  END {
    printf "# %10s", "size (B)"; for (i = 1; i <= n; i++) printf " %15s", name[i]; printf " %13s %13s\n", "MPIbest/fcMPI", "fcMPI/fcTCP"
    for (k = 1; k <= m; k++) {
      s = size[k]; printf "  %10s", s
      for (i = 1; i <= n; i++) printf " %15s", ((i, s) in t ? t[i, s] : "-")
      best = min3(t[1, s], t[2, s], t[3, s]); ours = t[5, s]; tcp = t[7, s]
      printf " %13s %13s\n", (ours > 0 ? sprintf("%.2f", best / ours) : "-"), (tcp > 0 ? sprintf("%.3f", ours / tcp) : "-")
    }
    wrong = 0; for (i = 1; i <= n; i++) wrong += bad[i]
    printf "# wrong elements, all variants: %d (fcMPI, fcTCP: auto = the hierarchical schedule across equal hosts)\n", wrong
    if (wrong > 0) exit 1
  }' $(for v in mpi-tuned mpi-tuned-eager mpi-han fc-mpi-ring fc-mpi-auto fc-tcp-ring fc-tcp-auto; do echo "$out/$v"; done)
