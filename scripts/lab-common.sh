# Sourced by the lab's test scripts (lab-hosts.sh, lab-faults.sh): the
# checks before a lab may be built, and its teardown on any exit.
#   lab_preflight NAME   sets $lab, $bin and $out, or skips (exit 0; exit 1
#                        with FERROCOLL_REQUIRE_LAB=1) saying why as "lab NAME: …"
lab_preflight() {
  lab_name=$1
  lab=scripts/lab.sh
  bin=$(realpath "${FERROCOLL_BIN:-target/release/ferrocoll}")
  [ "$(id -u)" = 0 ] || lab_skip "not root"
  local t
  for t in ip tc unshare nsenter setsid; do command -v "$t" > /dev/null || lab_skip "no $t"; done
  [ -x "$bin" ] || lab_skip "no $bin (cargo build --release)"
  ! ip netns list 2>/dev/null | grep -q '^fclab-' || lab_skip "a lab is already up"
  out=$(mktemp -d)
  trap lab_cleanup EXIT
}

lab_skip() {
  if [ "${FERROCOLL_REQUIRE_LAB:-0}" = 1 ]; then echo "lab $lab_name: FAILED: $1" >&2; exit 1; fi
  echo "lab $lab_name: skipped ($1)"; exit 0
}

lab_cleanup() { bash "$lab" down > /dev/null 2>&1 || true; rm -rf "$out"; }
