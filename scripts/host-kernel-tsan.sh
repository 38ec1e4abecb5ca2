#!/usr/bin/env bash
# The device interpreter's own source (cuda/interpret.cu) under
# ThreadSanitizer, on CPU threads: the conformance and failure tests of
# crates/cuda/src/program/emulate/tests.rs on the source rig, one thread
# per block, built with -fsanitize=thread. Every byte that blocks of
# different ranks and channels share must be ordered by the kernel's own
# acquire/release (posted, consumed, hello, done words) under the C++
# memory model, which orders less than the x86 the plain tests run on.
# Exits non-zero on any report. CI runs it after the tests.
#
# Usage: scripts/host-kernel-tsan.sh [test filter, default: emulate]
set -euo pipefail
cd "$(dirname "$0")/.."
filter="${1:-emulate}"
cxx="${CXX:-c++}"
runtime=$($cxx -print-file-name=libtsan.so)
if [ ! -e "$runtime" ]; then
  echo "no ThreadSanitizer runtime for $cxx ($runtime)" >&2
  exit 2
fi
bin=$(cargo test -q -p ferrocoll-cuda --lib --no-run --message-format=json | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["lib"]:
        print(m["executable"])')
if [ -z "$bin" ]; then
  echo "could not find the ferrocoll-cuda test binary" >&2
  exit 2
fi
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
# The Rust test harness hands results over a channel whose atomics the
# sanitizer does not see (Rust code is not instrumented): not the kernel's.
echo 'race:mpmc' > "$scratch/suppressions"
run() {
  TMPDIR="$scratch" FERROCOLL_HOST_KERNEL_TSAN=1 FERROCOLL_REQUIRE_HOST_KERNEL=1 \
    TSAN_OPTIONS="suppressions=$scratch/suppressions halt_on_error=1" LD_PRELOAD="$runtime" \
    "$@" "$bin" --test-threads 2 "$filter"
}
if ! run > "$scratch/log" 2>&1; then
  # Some kernels place mappings where this sanitizer does not expect them:
  # once more without address randomisation.
  if grep -q "unexpected memory mapping" "$scratch/log"; then
    run setarch "$(uname -m)" -R > "$scratch/log" 2>&1 || { cat "$scratch/log"; exit 1; }
  else
    cat "$scratch/log"
    exit 1
  fi
fi
grep -E "^test result|ThreadSanitizer" "$scratch/log"
