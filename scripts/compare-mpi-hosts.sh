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
# The variants take turns, round after round (a shared machine drifts);
# per size the table gives each variant's median out-of-place time over
# the rounds, then the ratios that matter: OpenMPI's best time over
# ferrocoll-over-MPI's (≥ 1: we are faster) and ferrocoll over MPI links
# against over its own TCP (1.00: the link kind costs nothing).
#
#   scripts/compare-mpi-hosts.sh --hosts H --per-host L [--rate 1gbit] [--rounds 3] [-- BENCH_ARGS...]
#
# BENCH_ARGS default to "-b 1M -e 64M -f 4 -n 5 -w 3". Needs root, the
# lab's tools, OpenMPI and a ferrocoll built with `--features mpi`
# (FERROCOLL_BIN, else built here).
set -euo pipefail
cd "$(dirname "$0")/.."
hosts=2 per_host=2 rate=1gbit rounds=3
while [[ $# -gt 0 ]]; do
  case $1 in
    --hosts) hosts=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --per-host) per_host=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --) shift; break ;;
    *) sed -n '2,22s/^# \{0,1\}//p' "$0" >&2; exit 2 ;;
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

# NAME MPIRUN_ARGS... -- CMD...: one variant, its table kept as
# $out/NAME.ROUND.
variant() {
  local name=$1
  shift
  echo "== round $round: $name"
  bash scripts/lab-mpi.sh run "$per_host" "$@" 2>&1 | tr -d '\0' | tee "$out/$name.$round" | grep -E '^ *[0-9]|rror|wrong|Out of bounds' || true
}
eager=(--mca btl_tcp_eager_limit 1048576 --mca btl_tcp_rndv_eager_limit 1048576)
han=(--mca coll_han_priority 100 --mca coll_han_use_simple_allreduce 1)
for round in $(seq 1 "$rounds"); do
  variant mpi-tuned -- "$mpi_bin" "${args[@]}"
  variant mpi-tuned-eager "${eager[@]}" -- "$mpi_bin" "${args[@]}"
  variant mpi-han "${han[@]}" -- "$mpi_bin" "${args[@]}"
  for net in mpi tcp; do
    for algo in ring auto; do
      variant "fc-$net-$algo" -- "$bin" bench --backend cpu --transport auto --net "$net" \
        --algo "$algo" --op all-reduce "${args[@]}"
    done
  done
done

variants="mpi-tuned mpi-tuned-eager mpi-han fc-mpi-ring fc-mpi-auto fc-tcp-ring fc-tcp-auto"
# One line per variant, round and size: name, size, out-of-place µs,
# in-place µs, wrong elements.
for v in $variants; do
  for r in $(seq 1 "$rounds"); do
    awk -v v="$v" -v mpi="$([[ $v == mpi-* ]] && echo 1 || echo 0)" '/^ *[0-9]/ {
      print v, $1, (mpi ? $5 : $6), $10, (mpi ? $8 + $13 : $9 + $13) }' "$out/$v.$r"
  done
done > "$out/all"
for mode in 3 4; do
  label=$([ "$mode" = 3 ] && echo out-of-place || echo in-place)
  echo "== summary: $hosts hosts × $per_host ranks, $rate per host link, all-reduce f32, $label µs, median of $rounds rounds (every row checked)"
  awk -v names="$variants" -v col="$mode" '
    BEGIN { n = split(names, name, " ") }
    { k = $1 SUBSEP $2; c[k]++; t[k, c[k]] = $col; wrong += $5; if (!($2 in seen)) { seen[$2] = 1; size[++m] = $2 } }
    function median(k,   i, j, x, a, cnt) {
      cnt = c[k]; if (!cnt) return 0
      for (i = 1; i <= cnt; i++) a[i] = t[k, i]
      for (i = 2; i <= cnt; i++) { x = a[i]; for (j = i - 1; j >= 1 && a[j] > x; j--) a[j + 1] = a[j]; a[j + 1] = x }
      return cnt % 2 ? a[(cnt + 1) / 2] : (a[cnt / 2] + a[cnt / 2 + 1]) / 2
    }
    END {
      printf "# %10s", "size (B)"; for (i = 1; i <= n; i++) printf " %15s", name[i]; printf " %13s %13s\n", "MPIbest/fcMPI", "fcMPI/fcTCP"
      for (s = 1; s <= m; s++) {
        z = size[s]; printf "  %10s", z
        best = 0
        for (i = 1; i <= n; i++) {
          med[i] = median(name[i] SUBSEP z); printf " %15.1f", med[i]
          if (i <= 3 && med[i] > 0 && (best == 0 || med[i] < best)) best = med[i]
        }
        printf " %13s %13s\n", (med[5] > 0 ? sprintf("%.2f", best / med[5]) : "-"), (med[7] > 0 ? sprintf("%.3f", med[5] / med[7]) : "-")
      }
      printf "# wrong elements, all variants and rounds: %d (fc-*-auto: the hierarchical schedule across equal hosts)\n", wrong
      if (wrong > 0) exit 1
    }' "$out/all"
done
