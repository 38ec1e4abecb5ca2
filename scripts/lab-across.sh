#!/usr/bin/env bash
# Across hosts on the emulated cluster (scripts/lab.sh): all-reduce f32 16 MiB
# on H hosts × L ranks, each host started by its own `ferrocoll launch
# --nnodes`, the algorithms alternated round by round, every call checked.
# Prints one line per run and, per algorithm, the median of the rounds'
# out-of-place times next to `sim --topo cpu-cluster:...`. `auto` is the
# default (no network rate: the hierarchical rule); `auto-net` is `auto`
# with `--net-gbps` of the link's rate, selecting on the cluster's model,
# and the line says what it picked.
#
#   scripts/lab-across.sh [--hosts H] [--ranks L] [--rate 1gbit] [--rounds 3] [--transport auto]
#
# Needs root, the lab's tools and a release build (FERROCOLL_BIN or
# target/release/ferrocoll). Brings a lab up and tears it down.
set -euo pipefail
cd "$(dirname "$0")/.."
hosts=2 ranks=2 rate=1gbit rounds=3 transport=auto
while [ $# -gt 0 ]; do
  case $1 in
    --hosts) hosts=$2; shift 2 ;; --ranks) ranks=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;; --rounds) rounds=$2; shift 2 ;;
    --transport) transport=$2; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
lab=scripts/lab.sh
bin=$(realpath "${FERROCOLL_BIN:-target/release/ferrocoll}")
gbit=${rate%gbit}
out=$(mktemp -d)
cleanup() { bash "$lab" down > /dev/null 2>&1 || true; rm -rf "$out"; }
trap cleanup EXIT
bash "$lab" up "$hosts" --rate "$rate" > /dev/null
topo="cpu-cluster:hosts=$hosts,ranks=$ranks,gbit=$gbit"
"$bin" synth --topo "$topo" --kind hierarchical --size 16M --output "$out/hier.json" > /dev/null

# One run: ALGO PORT; prints the out-of-place µs of the 16 MiB row.
run() {
  local algo=$1 port=$2 k pids=() extra=()
  if [ "$algo" = auto-net ]; then algo=auto extra=(--net-gbps "$gbit"); fi
  for k in $(seq $((hosts - 1)) -1 0); do
    FERROCOLL_LOG=debug FERROCOLL_JOB_SECRET="lab-across-$$-$port" bash "$lab" exec "$k" -- "$bin" launch \
      --nnodes "$hosts" --node-rank "$k" --nproc-per-node "$ranks" \
      --rdzv-endpoint "198.18.0.1:$port" --rdzv-timeout 60 -- ferrocoll bench \
      --transport "$transport" --algo "$algo" "${extra[@]}" -b 16M -e 16M -n 5 -w 1 -c 1 > "$out/run.$k" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || { echo "run $algo failed" >&2; tail -n 20 "$out"/run.* >&2; exit 1; }; done
  grep -q 'Out of bounds values : 0 OK' "$out/run.0" || { echo "wrong values ($algo)" >&2; exit 1; }
  awk '$3 == 16777216 {print $8}' "$out/run.0" | head -n 1
}

# What the last run's calls ran, from rank 0's debug line.
picked() {
  sed -n 's/.*algorithm=\(.*\) channels=.*/\1/p' "$out/run.0" | sort | uniq -c | sort -rn | head -n 1 | sed 's/^ *[0-9]* //'
}

declare -A times
port=29700
for round in $(seq 1 "$rounds"); do
  for algo in ring "$out/hier.json" auto auto-net; do
    port=$((port + 1))
    t=$(run "$algo" "$port")
    name=$([ "$algo" = "$out/hier.json" ] && echo hierarchical || echo "$algo")
    times[$name]="${times[$name]:-} $t"
    echo "round $round: $name ${t} us ($(picked))"
  done
done
median() { tr ' ' '\n' | grep . | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
echo "# $hosts hosts × $ranks ranks, $rate per host link, transport $transport, all-reduce f32 16 MiB"
for name in ring hierarchical auto auto-net; do
  m=$(echo "${times[$name]}" | median)
  algo=$name; [ "$name" = hierarchical ] && algo="$out/hier.json"; [ "$name" = auto-net ] && algo=auto
  s=$("$bin" sim --topo "$topo" --algo "$algo" -b 16M -e 16M 2>/dev/null | awk '$1 == 16777216 {for (i=1;i<=NF;i++) if ($i ~ /^[0-9]+\.[0-9]+$/ && $i > 1000) {print $i; exit}}')
  printf '%-13s measured %10.0f us   sim %10.0f us   measured/sim %.3f\n' "$name" "$m" "$s" "$(echo "$m / $s" | bc -l)"
done
bash "$lab" down --strict > /dev/null
