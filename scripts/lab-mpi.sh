#!/usr/bin/env bash
# mpirun across the emulated cluster (scripts/lab.sh): ranks in H lab hosts,
# L per host, started by OpenMPI's mpirun from inside host 0 with an rsh
# agent that enters the other hosts (scripts/lab-mpi-agent.sh), and MPI's
# TCP (out-of-band and BTL) kept to the lab interface eth0.
#
#   scripts/lab-mpi.sh up H [--rate RATE]     build the lab and start the agent's broker
#   scripts/lab-mpi.sh run L [MPIRUN_ARGS...] -- CMD...
#                                             mpirun CMD on H×L ranks (block by host)
#   scripts/lab-mpi.sh down                   stop the broker, tear the lab down (--strict)
#
# Needs root, the lab's tools and OpenMPI (mpirun, orted). Every mpirun uses
# pml ob1 with btl self,vader,tcp: shared memory inside a host, TCP on eth0
# between hosts (Debian's build would otherwise try UCX first).
set -euo pipefail
cd "$(dirname "$0")/.."
readonly STATE=${FCLAB_STATE:-/run/fclab}
lab=scripts/lab.sh

broker_dir() { cat "$STATE/mpi-broker-dir" 2>/dev/null || true; }

# The broker: runs each request the agent queues inside its lab host, in
# the background, and records its exit status (see lab-mpi-agent.sh).
broker() {
  local dir=$1 req
  exec 3<>"$dir/queue"
  while read -r -u 3 req; do
    [[ $req == stop ]] && break
    [[ $req == "$dir"/req.* && -d $req ]] || continue
    (
      bash "$lab" exec "$(cat "$req/host")" -- sh -c "$(cat "$req/cmd")" > "$req/out" 2>&1 < /dev/null
      echo $? > "$req/rc.part"
      mv "$req/rc.part" "$req/rc"
    ) &
  done
}

cmd_up() {
  local hosts=$1
  shift
  bash "$lab" up "$hosts" "$@" > /dev/null
  local dir
  dir=$(mktemp -d /tmp/fclab-mpi.XXXXXX)
  mkfifo "$dir/queue"
  echo "$dir" > "$STATE/mpi-broker-dir"
  broker "$dir" > /dev/null 2>&1 &
  echo $! > "$STATE/mpi-broker-pid"
  disown
}

cmd_run() {
  local per_host=$1
  shift
  local mpi_args=()
  while (($#)) && [[ $1 != -- ]]; do mpi_args+=("$1"); shift; done
  [[ ${1:-} == -- ]] && shift
  (($#)) || { echo "lab-mpi: run: no command" >&2; exit 2; }
  local dir hosts hostfile
  dir=$(broker_dir)
  [[ -n $dir && -p $dir/queue ]] || { echo "lab-mpi: no broker (lab-mpi.sh up first)" >&2; exit 1; }
  hosts=$(ls "$STATE"/host[0-9] 2>/dev/null | wc -l)
  hostfile="$dir/hostfile"
  : > "$hostfile"
  for k in $(seq 0 $((hosts - 1))); do echo "fclab-h$k slots=$per_host" >> "$hostfile"; done
  bash "$lab" exec 0 -- env FCLAB_MPI_BROKER="$dir" mpirun --allow-run-as-root \
    --hostfile "$hostfile" -n $((hosts * per_host)) --map-by slot --bind-to none \
    --mca plm_rsh_agent "$PWD/scripts/lab-mpi-agent.sh" \
    --mca oob_tcp_if_include eth0 --mca btl_tcp_if_include eth0 \
    --mca pml ob1 --mca btl self,vader,tcp "${mpi_args[@]}" "$@"
}

cmd_down() {
  local pid dir
  pid=$(cat "$STATE/mpi-broker-pid" 2>/dev/null || true)
  dir=$(broker_dir)
  if [[ -n $pid ]] && [[ $(tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null) == *lab-mpi.sh* ]]; then
    kill "$pid" 2> /dev/null || true
  fi
  [[ -n $dir && $dir == /tmp/fclab-mpi.* ]] && rm -rf "$dir"
  rm -f "$STATE/mpi-broker-pid" "$STATE/mpi-broker-dir"
  bash "$lab" down "$@"
}

case ${1:-} in
  up) shift; cmd_up "$@" ;;
  run) shift; cmd_run "$@" ;;
  down) shift; cmd_down "$@" ;;
  *) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
