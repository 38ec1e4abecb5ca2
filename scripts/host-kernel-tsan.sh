#!/usr/bin/env bash
# The device interpreter's own source (cuda/interpret.cu) under
# ThreadSanitizer, on CPU threads: the conformance and failure tests of
# crates/cuda/src/program/tests.rs, one thread
# per block, built with -fsanitize=thread. Every byte that blocks of
# different ranks and channels share must be ordered by the kernel's own
# acquire/release (posted, consumed, hello, done words; the relaxed
# counters published after one fence stand in as releases) under the C++
# memory model, which orders less than the x86 the plain tests run on.
# Exits non-zero on any report with a frame in the kernel's source. CI
# runs it after the tests.
#
# Usage: scripts/host-kernel-tsan.sh [test filter, default: program::tests]
set -euo pipefail
cd "$(dirname "$0")/.."
filter="${1:-program::tests}"
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
# Rust code is not instrumented: it synchronises through atomics the
# sanitizer does not see, so its own copies and frees (the test harness's
# channels, Arc drops) can be reported as races. Only reports with a frame
# in the kernel's source count; the rest are listed as set aside.
run() {
  TMPDIR="$scratch" FERROCOLL_HOST_KERNEL_TSAN=1 FERROCOLL_REQUIRE_HOST_KERNEL=1 \
    TSAN_OPTIONS="log_path=$scratch/tsan exitcode=0" LD_PRELOAD="$runtime" \
    "$@" "$bin" --test-threads 2 "$filter"
}
if ! run > "$scratch/log" 2>&1; then
  # Some kernels place mappings where this sanitizer does not expect them:
  # once more without address randomisation.
  if cat "$scratch"/tsan.* 2>/dev/null | grep -q "unexpected memory mapping"; then
    rm -f "$scratch"/tsan.*
    run setarch "$(uname -m)" -R > "$scratch/log" 2>&1 || { cat "$scratch/log"; exit 1; }
  else
    cat "$scratch/log" "$scratch"/tsan.* 2>/dev/null
    exit 1
  fi
fi
grep -E "^test result" "$scratch/log"
cat "$scratch"/tsan.* 2>/dev/null | python3 -c '
import sys
reports = [r for r in sys.stdin.read().split("==================") if "ThreadSanitizer:" in r]
kernel = [r for r in reports if "interpret.cpp" in r]
for r in kernel:
    print(r)
print(f"ThreadSanitizer: {len(kernel)} report(s) in the kernel source, "
      f"{len(reports) - len(kernel)} set aside (Rust code only)")
sys.exit(1 if kernel else 0)'
