#!/usr/bin/env bash
# scripts/lab-selftest.sh — proves that scripts/lab.sh builds a working emulated cluster
# and leaves nothing behind: 2 hosts at 1 Gbit/s; host 0 reaches 198.18.0.2; /dev/shm and
# the hostname are private per host; `exec` keeps the environment, working directory and
# exit status; tbf shapes both ends of each link and TCP gets ~0.95 of the rate; `fault
# kill` removes a host's processes; `down` leaves nothing (`check-clean`). About 5 s.
#
# Needs root, ip, tc, unshare, nsenter, setsid, python3 and a kernel with namespaces,
# veth, bridge and tbf. Without them it prints `lab: skipped (<reason>)` and exits 0, or
# exits 1 when FERROCOLL_REQUIRE_LAB=1. It refuses to touch a lab that is already up.
set -euo pipefail

LAB=$(cd "$(dirname "$0")" && pwd)/lab.sh
RATE=1gbit
STARTED=0
TMP=""

skip() {
  if [[ ${FERROCOLL_REQUIRE_LAB:-0} == 1 ]]; then
    echo "lab: unavailable ($1) and FERROCOLL_REQUIRE_LAB=1" >&2
    exit 1
  fi
  echo "lab: skipped ($1)"
  exit 0
}
fail() { echo "lab selftest: FAILED: $*" >&2; exit 1; }
step() { echo "lab selftest: $*"; }

preflight() {
  [[ $EUID -eq 0 ]] || skip "needs root"
  local t
  for t in ip tc unshare nsenter setsid python3; do
    command -v "$t" >/dev/null || skip "'$t' is not installed"
  done
  # A throwaway anonymous namespace (no name, nothing in the root namespace) shows that
  # the kernel has what the lab needs; it vanishes when the probe exits.
  unshare --net --mount --uts --pid --fork sh -c \
    'ip link add name fcp0 type veth peer name fcp1 && ip link add name fcbr type bridge &&
     tc qdisc add dev fcp0 root tbf rate 1gbit burst 250000 latency 10ms' >/dev/null 2>&1 ||
    skip "the kernel lacks namespaces, veth, bridge or tbf"
  if ip netns list 2>/dev/null | grep -q '^fclab-' || [[ -e ${FCLAB_STATE:-/run/fclab} ]]; then
    skip "a lab is already up; not touching it (scripts/lab.sh down)"
  fi
}

cleanup() {
  local rc=$?
  set +e
  ((STARTED)) && "$LAB" down >/dev/null 2>&1
  [[ -z $TMP ]] || rm -rf -- "$TMP"
  ((rc == 0)) || echo "lab selftest: torn down after a failure" >&2
  exit "$rc"
}

# A tiny TCP tool, run inside the hosts: `recv ADDR PORT` prints the Gbit/s it received
# (first byte to EOF); `send ADDR PORT SECS` connects (retrying while the receiver starts)
# and sends for SECS; `pong`/`ping` exchange one line.
write_helper() {
  cat >"$TMP/net.py" <<'PY'
import socket, sys, time
role, addr, port = sys.argv[1], sys.argv[2], int(sys.argv[3])

def connect():
    deadline = time.monotonic() + 5
    while True:
        try:
            return socket.create_connection((addr, port), timeout=2)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)

if role in ("recv", "pong"):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((addr, port)); s.listen(1); s.settimeout(10)
    c, _ = s.accept()
    if role == "pong":
        c.sendall(b"pong\n"); c.close(); sys.exit(0)
    buf = bytearray(1 << 20); n = 0; t0 = None
    while True:
        k = c.recv_into(buf)
        if not k:
            break
        if t0 is None:
            t0 = time.monotonic()   # the clock starts at the first byte, not counted
        else:
            n += k
    print(f"{n * 8 / (time.monotonic() - t0) / 1e9:.3f}")
elif role == "ping":
    print(connect().makefile().readline().strip())
else:
    c = connect(); data = b"\0" * (1 << 20); end = time.monotonic() + float(sys.argv[4])
    while time.monotonic() < end:
        c.sendall(data)
    c.close()
PY
}

in_host() { "$LAB" exec "$@"; }

check_reach() {
  if command -v ping >/dev/null; then
    in_host 0 -- ping -c1 -W1 198.18.0.2 >/dev/null || fail "host 0 cannot ping 198.18.0.2"
  else
    in_host 1 -- "$PY" "$TMP/net.py" pong 198.18.0.2 5300 &
    local got
    got=$(in_host 0 -- "$PY" "$TMP/net.py" ping 198.18.0.2 5300) || true
    wait $! || true
    [[ $got == pong ]] || fail "host 0 got no answer from 198.18.0.2 (got '$got')"
  fi
  step "host 0 reaches 198.18.0.2"
}

check_private() {
  local name=fclab-selftest-$$
  in_host 0 -- sh -c "echo x >/dev/shm/$name"
  in_host 0 -- test -e "/dev/shm/$name" || fail "host 0 does not see its own /dev/shm file"
  in_host 1 -- test ! -e "/dev/shm/$name" || fail "host 1 sees host 0's /dev/shm"
  [[ ! -e /dev/shm/$name ]] || fail "the machine's /dev/shm sees host 0's file"
  local out
  if out=$("$LAB" leftovers 2>&1); then fail "leftovers exited 0 with a file in host 0's /dev/shm"; fi
  [[ $out == *"$name"* ]] || fail "leftovers does not name host 0's file ('$out')"
  in_host 0 -- rm "/dev/shm/$name"
  "$LAB" leftovers >/dev/null || fail "leftovers reports files after they were removed"
  [[ $(in_host 1 -- hostname) == fclab-h1 ]] || fail "host 1's hostname is not fclab-h1"
  [[ $(hostname) != fclab-h* ]] || fail "the machine's hostname changed"
  step "/dev/shm and hostname are private per host"
}

check_exec() {
  local out
  out=$(cd "$TMP" && FCLAB_PROBE=42 in_host 0 -- sh -c 'echo "$PWD $FCLAB_PROBE"')
  [[ $out == "$TMP 42" ]] || fail "exec lost the working directory or environment ('$out')"
  local rc=0
  in_host 0 -- sh -c 'exit 7' || rc=$?
  ((rc == 7)) || fail "exec returned $rc instead of the command's 7"
  step "exec keeps environment, working directory and exit status"
}

check_shaping() {
  local k
  for k in 0 1; do
    tc -n "fclab-h$k" qdisc show dev eth0 | grep -q tbf || fail "no tbf on host $k's eth0"
    tc -n fclab-sw qdisc show dev "p$k" | grep -q tbf || fail "no tbf on host $k's switch port"
  done
  in_host 1 -- "$PY" "$TMP/net.py" recv 198.18.0.2 5301 >"$TMP/rate" &
  local recv=$!
  in_host 0 -- "$PY" "$TMP/net.py" send 198.18.0.2 5301 1.5 || fail "the sender failed"
  wait "$recv" || fail "the receiver failed"
  local gbit ratio
  gbit=$(<"$TMP/rate")
  ratio=$(awk -v g="$gbit" 'BEGIN { printf "%.2f", g / 1.0 }')
  step "tbf on both ends; measured $gbit Gbit/s at $RATE (ratio $ratio)"
  awk -v r="$ratio" 'BEGIN { exit !(r <= 1.02) }' || fail "faster than the rate: shaping is not working"
  awk -v r="$ratio" 'BEGIN { exit !(r >= 0.5) }' || fail "far below the rate"
  awk -v r="$ratio" 'BEGIN { exit !(r >= 0.85) }' || echo "lab selftest: warning: below 0.85 of the rate (busy CPUs?)" >&2
}

check_kill() {
  (in_host 1 -- sleep 300 || true) 2>/dev/null &   # killed with its host: no notice
  local job=$! init i
  sleep 0.3
  init=$(awk -F= '$1 == "child" { print $2 }' "${FCLAB_STATE:-/run/fclab}/host1")
  "$LAB" fault kill 1 >/dev/null
  wait "$job" 2>/dev/null || true   # the exec wrapper ends when its host dies
  for ((i = 0; i < 10; i++)); do
    [[ -n $(ip netns pids fclab-h1) ]] || break
    sleep 0.1
  done
  [[ -z $(ip netns pids fclab-h1) ]] || fail "host 1 still has processes: $(ip netns pids fclab-h1 | tr '\n' ' ')"
  [[ ! -e /proc/$init ]] || [[ $(awk '{ print $3 }' "/proc/$init/stat" 2>/dev/null) == Z ]] ||
    fail "host 1's init $init is still alive"
  ! in_host 1 -- true 2>/dev/null || fail "exec into a killed host succeeded"
  in_host 0 -- true || fail "host 0 died with host 1"
  step "fault kill 1 removed all of host 1's processes; host 0 lives"
}

main() {
  preflight
  PY=$(python3 -c 'import sys; print(sys.executable)')
  TMP=$(mktemp -d /tmp/fclab-selftest.XXXXXX)
  trap cleanup EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  write_helper
  STARTED=1
  "$LAB" up 2 --rate "$RATE" >/dev/null
  check_reach
  check_private
  check_exec
  check_shaping
  check_kill
  "$LAB" down >/dev/null
  STARTED=0
  "$LAB" check-clean >/dev/null || { "$LAB" check-clean; fail "something was left after down"; }
  step "down left nothing"
  echo "lab selftest: ok"
}

main "$@"
