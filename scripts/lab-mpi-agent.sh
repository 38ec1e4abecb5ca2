#!/usr/bin/env bash
# mpirun's rsh agent on the emulated cluster (scripts/lab-mpi.sh sets it):
# `lab-mpi-agent.sh HOST CMD...` runs CMD inside lab host HOST (fclab-hK).
#
# mpirun runs inside host 0, whose private pid namespace hides the other
# hosts, so the agent cannot enter them itself: it hands the command to
# lab-mpi.sh's broker in the machine's own namespaces (a request
# directory and a line on a FIFO under $FCLAB_MPI_BROKER, a folder of
# the shared /tmp) and, as ssh would, lasts as long as the command.
set -euo pipefail
host=$1
shift
k=${host#fclab-h}
[[ $k =~ ^[0-7]$ ]] || { echo "lab-mpi-agent: not a lab host: $host" >&2; exit 2; }
broker=${FCLAB_MPI_BROKER:?lab-mpi-agent runs under scripts/lab-mpi.sh}
req=$(mktemp -d "$broker/req.XXXXXX")
echo "$k" > "$req/host"
printf '%s' "$*" > "$req/cmd"
echo "$req" > "$broker/queue"
while [[ ! -e $req/rc ]]; do sleep 0.1; done
cat "$req/out" >&2
rc=$(cat "$req/rc")
rm -rf "$req"
exit "$rc"
