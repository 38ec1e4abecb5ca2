#!/usr/bin/env bash
# The calibration of docs/topology.md: the simulator's prediction for the
# CPU executor's all-reduce on this host's measured topology, beside the
# measured time, for 2 and 4 ranks and 4 KiB .. 64 MiB. `--membw` measures
# memory bandwidth just before each sweep and the prediction uses it, so
# both come from the same run.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q  # once, so the runs below start at once
for ranks in 2 4; do
  cargo run --release -q -- bench --ranks "$ranks" -b 4K -e 64M -f 4 -n 40 --membw --predict "$@"
done
