#!/usr/bin/env bash
# scripts/lab.sh — an emulated cluster of up to 8 "hosts" on this one machine, for running
# ranks on several hosts without several machines. Needs root, iproute2 (ip, tc) and
# util-linux (unshare, nsenter, setsid).
#
#   lab.sh up N [--rate RATE] [--shm-size SIZE] [--force]
#                         build N hosts (1..8); RATE is a tc rate (default 1gbit) or `none`
#   lab.sh exec K -- CMD...   run CMD inside host K (same environment and working directory)
#   lab.sh shape RATE [K]     re-shape every host link (or host K's), both directions
#   lab.sh fault KIND K [J]   KIND: link-down link-up kill power-loss drop-in drop-out heal
#                             (drop-in/drop-out: only traffic from/to host J, if given)
#   lab.sh status             hosts, addresses, rates, links, whether each host is alive
#   lab.sh leftovers          list files in every live host's /dev/shm; exit 1 if any
#   lab.sh down [--strict]    tear everything down (idempotent); --strict: exit 3 if a
#                             host's /dev/shm still held files (they are listed either way)
#   lab.sh check-clean        exit 1, saying what is left, unless nothing of a lab remains
#
# Layout: namespace fclab-sw holds bridge br0; host K is namespace fclab-hK whose eth0
# (198.18.0.(K+1)/24, inside the namespace only) is a veth whose peer is bridge port pK.
# IPv6 is off on every lab interface but loopback, so that nothing but 198.18.0.0/24
# (and loopback) is ever configured or sent. The root namespace's interfaces, routes and
# firewall are never touched. Each link is shaped with tbf on both ends (eth0: host's
# transmit; pK: host's receive). netem, fq and police are absent from this kernel, so no
# delay, loss or fair queueing can be emulated.
#
# A host also needs its own /dev/shm (`ip netns exec` alone shares the machine's): each
# host has a "holder", `unshare --mount --uts --pid --fork` run inside the host's network
# namespace, whose child mounts a private tmpfs on /dev/shm, sets the hostname to fclab-hK
# and sleeps. That child is the host's pid-namespace init: `exec` enters its namespaces,
# and killing it kills every process of the host (a crash with the kernel alive; peers
# see FIN/RST). `power-loss` first takes the link down so that peers see nothing.
#
# The one-way partitions (drop-in, drop-out, heal) use iptables inside the host's
# namespace. iptables is not always installed (it was not where this was written); the
# script only detects it. Install it first, e.g. in CI: `apt-get install -y iptables`
# (Debian); without it those faults say so and exit 2.
#
# State: ${FCLAB_STATE:-/run/fclab}/ holds `lab` and one `hostK` file per host (holder and
# child PIDs with their start times and network namespace, so that teardown kills only
# processes it started and that still are what it recorded) plus `hostK.log`.
# FCLAB_FAIL_AT=K (testing only) makes `up` fail after building host K, to exercise the
# teardown that a half-built lab gets.
set -euo pipefail

readonly STATE=${FCLAB_STATE:-/run/fclab}
readonly SW=fclab-sw BR=br0 NET=198.18.0 MAX_HOSTS=8
readonly TBF_LATENCY=10ms    # queue bound of the tbf: room for a burst of several flows
readonly MIN_BURST=16384     # bytes; a burst below a few frames stalls low rates
readonly HOLDER_TAG=fclab-shm-h   # appears in every holder's command line (tmpfs name)
readonly WAIT_TICKS=50       # bounded waits: 50 × 0.2 s

usage() {
  sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'
  exit "${1:-2}"
}
die() { echo "lab: $*" >&2; exit 1; }
say() { echo "lab: $*"; }
warn() { echo "lab: warning: $*" >&2; }

host_ns() { echo "fclab-h$1"; }
host_addr() { echo "$NET.$(($1 + 1))"; }
host_file() { echo "$STATE/host$1"; }

# ---------------------------------------------------------------- small helpers

# KEY=VALUE files: read one key (empty if absent), or replace one key.
state_get() { [[ -r $1 ]] || return 0; awk -F= -v k="$2" '$1 == k { print substr($0, length(k) + 2); exit }' "$1"; }
state_set() {
  local tmp="$1.tmp"
  awk -F= -v k="$2" -v v="$3" '$1 == k { print k "=" v; next } { print }' "$1" >"$tmp"
  mv -f "$tmp" "$1"
}

# A tc rate → bits per second (integer), or "none" → 0. tc's k/m/g are powers of 1000,
# "bit" is bits and "bps" is BYTES per second.
rate_bits() {
  [[ ${1,,} == none ]] && { echo 0; return; }
  awk -v r="${1,,}" 'BEGIN {
    if (!match(r, /^[0-9]+(\.[0-9]+)?/)) exit 1
    n = substr(r, 1, RLENGTH); u = substr(r, RLENGTH + 1)
    m[""] = 1; m["bit"] = 1; m["kbit"] = 1e3; m["mbit"] = 1e6; m["gbit"] = 1e9; m["tbit"] = 1e12
    m["bps"] = 8; m["kbps"] = 8e3; m["mbps"] = 8e6; m["gbps"] = 8e9; m["tbps"] = 8e12
    if (!(u in m) || n * m[u] < 8000) exit 1
    printf "%.0f\n", n * m[u] }' || die "bad rate '$1' (want e.g. 100mbit, 1gbit, 10gbit or none)"
}

# "state ppid starttime" of a process, from /proc/PID/stat (the name field may hold spaces).
proc_info() {
  local line f
  { read -r line <"/proc/$1/stat"; } 2>/dev/null || return 1
  read -r -a f <<<"${line##*) }"
  echo "${f[0]} ${f[1]} ${f[19]}"
}

# True if PID is alive (not a zombie), started at START and lives in network namespace
# inode INO: i.e. it is still the process the lab recorded, not a reused PID.
pid_is() {
  local pid=$1 start=$2 ino=$3 info
  [[ $pid =~ ^[0-9]+$ && -n $start ]] || return 1
  info=$(proc_info "$pid") || return 1
  read -r -a info <<<"$info"
  [[ ${info[0]} != Z && ${info[2]} == "$start" ]] || return 1
  [[ $(stat -L -c %i "/proc/$pid/ns/net" 2>/dev/null) == "$ino" ]]
}

# The PID of a child of PID (the holder has exactly one). Scans /proc: this kernel has
# no /proc/PID/task/PID/children.
child_of() {
  local p info
  for p in /proc/[0-9]*; do
    info=$(proc_info "${p#/proc/}") || continue
    read -r -a info <<<"$info"
    if [[ ${info[1]} == "$1" && ${info[0]} != Z ]]; then echo "${p#/proc/}"; return 0; fi
  done
  return 1
}

lab_namespaces() { ip netns list 2>/dev/null | awk '$1 ~ /^fclab-/ { print $1 }'; }
hosts_recorded() { local f; for f in "$STATE"/host[0-9]; do [[ -e $f ]] && echo "${f##*host}"; done; true; }

# Host K's init (the holder's child) if it is alive and still the recorded one, else fail.
host_child() {
  local f; f=$(host_file "$1")
  [[ -r $f ]] || return 1
  local c; c=$(state_get "$f" child)
  pid_is "$c" "$(state_get "$f" child_start)" "$(state_get "$f" netns)" || return 1
  echo "$c"
}

require_root_tools() {
  [[ $EUID -eq 0 ]] || die "must run as root"
  local t
  for t in ip tc unshare nsenter setsid stat awk; do
    command -v "$t" >/dev/null || die "'$t' is not installed"
  done
}

check_host_index() {
  [[ $1 =~ ^[0-9]+$ ]] || die "bad host '$1'"
  [[ -e $(host_file "$1") ]] || die "no host $1 in the lab (is it up? see: lab.sh status)"
}

# ---------------------------------------------------------------- building

# A fresh namespace with loopback up. IPv6 is off for every interface made after this
# (`default`), so no link-local address, router solicitation or DAD packet ever exists;
# loopback, made with the namespace, keeps ::1.
ns_new() {
  ip netns add "$1"
  ip netns exec "$1" sh -c 'p=/proc/sys/net/ipv6/conf/default/disable_ipv6; [ ! -e $p ] || echo 1 >$p'
  ip -n "$1" link set lo up
}

# tbf on one end of a link; BITS=0 removes the shaping. Burst ≈ 2 ms at the rate: the
# notes measured 95–96 % of the rate with it, and less with smaller bursts.
shape_link() {
  local ns=$1 dev=$2 bits=$3 burst
  if ((bits == 0)); then
    tc -n "$ns" qdisc del dev "$dev" root 2>/dev/null || true
    return
  fi
  burst=$((bits / 4000))
  ((burst >= MIN_BURST)) || burst=$MIN_BURST
  tc -n "$ns" qdisc replace dev "$dev" root tbf rate "${bits}bit" burst "$burst" latency "$TBF_LATENCY"
}

# Both directions of host K's link: eth0 shapes what it sends, pK what it receives.
shape_host() {
  shape_link "$(host_ns "$1")" eth0 "$2"
  shape_link "$SW" "p$1" "$2"
}

make_switch() {
  ns_new "$SW"
  ip -n "$SW" link add "$BR" type bridge   # STP off by default: ports forward at once
  ip -n "$SW" link set "$BR" up
}

make_host() {
  local k=$1 bits=$2 ns
  ns=$(host_ns "$k")
  ns_new "$ns"
  # Made inside the switch namespace with the peer placed straight into the host's, so
  # no interface ever appears in the root namespace.
  ip -n "$SW" link add "p$k" type veth peer name eth0 netns "$ns"
  ip -n "$SW" link set "p$k" master "$BR"
  ip -n "$SW" link set "p$k" up
  ip -n "$ns" addr add "$(host_addr "$k")/24" dev eth0
  ip -n "$ns" link set eth0 up
  shape_host "$k" "$bits"
}

# Start host K's holder in its own session (terminal signals must not reach it) and
# record it. --kill-child: if the holder dies, the host dies with it, never orphaned.
start_holder() {
  local k=$1 rate=$2 size=$3 ns f pid info
  ns=$(host_ns "$k")
  f=$(host_file "$k")
  setsid ip netns exec "$ns" unshare --mount --uts --pid --fork --kill-child --mount-proc \
    --propagation private \
    sh -c 'mount -t tmpfs -o "size=$1,mode=1777" "$2" /dev/shm && hostname "$3" && exec sleep infinity' \
    fclab-holder "$size" "$HOLDER_TAG$k" "$ns" </dev/null >>"$f.log" 2>&1 &
  pid=$!
  disown "$pid"   # not a job of this shell: no "Killed" notice when a host is torn down
  info=$(proc_info "$pid") || die "host $k: holder exited at once: $(cat "$f.log")"
  read -r -a info <<<"$info"
  printf '%s\n' "host=$k" "ns=$ns" "addr=$(host_addr "$k")" "port=p$k" "rate=$rate" \
    "netns=$(stat -L -c %i "/run/netns/$ns")" "holder=$pid" "holder_start=${info[2]}" \
    "child=" "child_start=" >"$f"
}

# The holder as recorded: same start time, and already in the host's network namespace
# or still on its way there (its command line carries the tag).
holder_is() {
  local pid=$1 start=$2 ino=$3 info args
  pid_is "$pid" "$start" "$ino" && return 0
  info=$(proc_info "$pid") || return 1
  read -r -a info <<<"$info"
  [[ ${info[0]} != Z && ${info[2]} == "$start" ]] || return 1
  mapfile -d '' -t args 2>/dev/null <"/proc/$pid/cmdline" || return 1
  [[ " ${args[*]} " == *" $HOLDER_TAG"* ]]
}

# Wait (bounded) until host K's init runs `sleep infinity`, i.e. its tmpfs is mounted
# and its hostname set, and the tmpfs really differs from the machine's /dev/shm.
wait_holder() {
  local k=$1 f h hs ino c args i info
  f=$(host_file "$k")
  h=$(state_get "$f" holder) hs=$(state_get "$f" holder_start) ino=$(state_get "$f" netns)
  for ((i = 0; i < WAIT_TICKS; i++)); do
    holder_is "$h" "$hs" "$ino" || die "host $k: holder exited: $(tr '\n' ' ' <"$f.log")"
    if c=$(child_of "$h"); then
      mapfile -d '' -t args 2>/dev/null <"/proc/$c/cmdline" || args=()
      if [[ ${args[*]:-} == "sleep infinity" ]] &&
        [[ $(stat -L -c %d "/proc/$c/root/dev/shm") != "$(stat -L -c %d /dev/shm)" ]]; then
        info=$(proc_info "$c") && read -r -a info <<<"$info"
        state_set "$f" child "$c"
        state_set "$f" child_start "${info[2]}"
        return 0
      fi
    fi
    sleep 0.2
  done
  die "host $k did not come up within $((WAIT_TICKS / 5)) s"
}

lab_exists() { [[ -e $STATE || -n $(lab_namespaces) ]]; }

# On any failure or interruption of `up`: remove whatever was made.
UP_DONE=1
up_abort() {
  local rc=$?
  trap - EXIT INT TERM
  set +e
  if [[ $UP_DONE != 1 ]]; then
    echo "lab: up failed; tearing down what was made" >&2
    teardown
    ((rc != 0)) || rc=1
  fi
  exit "$rc"
}

cmd_up() {
  local n="" rate=1gbit shm=2g force=0 bits k
  while (($#)); do
    case $1 in
      --rate) rate=${2:?--rate needs a value}; shift 2 ;;
      --shm-size) shm=${2:?--shm-size needs a value}; shift 2 ;;
      --force) force=1; shift ;;
      -*) die "up: unknown option '$1'" ;;
      *) [[ -z $n ]] || die "up: extra argument '$1'"; n=$1; shift ;;
    esac
  done
  [[ $n =~ ^[0-9]+$ ]] && ((n >= 1 && n <= MAX_HOSTS)) || die "up: N must be 1..$MAX_HOSTS (got '${n}')"
  bits=$(rate_bits "$rate")
  [[ $shm =~ ^[0-9]+[kKmMgG%]?$ ]] || die "up: bad --shm-size '$shm' (e.g. 512m, 2g)"
  require_root_tools
  if lab_exists; then
    ((force)) || die "a lab is already up (state: $STATE, namespaces: $(lab_namespaces | tr '\n' ' ')); run 'lab.sh down' or 'up --force'"
    teardown
  fi
  UP_DONE=0
  trap up_abort EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  mkdir -p -- "$STATE"
  printf '%s\n' "hosts=$n" "rate=$rate" "shm=$shm" >"$STATE/lab"
  make_switch
  for ((k = 0; k < n; k++)); do
    make_host "$k" "$bits"
    [[ ${FCLAB_FAIL_AT:-} != "$k" ]] || die "FCLAB_FAIL_AT=$k: failing on purpose"
  done
  for ((k = 0; k < n; k++)); do start_holder "$k" "$rate" "$shm"; done
  for ((k = 0; k < n; k++)); do wait_holder "$k"; done
  UP_DONE=1
  trap - EXIT INT TERM
  say "up: $n host(s) at $rate, /dev/shm $shm each"
  cmd_status
}

# ---------------------------------------------------------------- tearing down

# Wait (bounded) until a recorded process is gone; fail if it is still there.
wait_gone() {
  local i
  for ((i = 0; i < WAIT_TICKS; i++)); do
    "$@" || return 0
    sleep 0.2
  done
  return 1
}

# Print the files left in host K's /dev/shm (C: its init); fail if there are any.
show_shm() {
  local k=$1 c=$2 files
  files=$(find "/proc/$c/root/dev/shm" -mindepth 1 -maxdepth 1 -printf '%P (%s bytes)\n' 2>/dev/null) || true
  [[ -n $files ]] || return 0
  sed "s|^|lab: host $k: left in /dev/shm: |" <<<"$files" >&2
  return 1
}

# Kill host K: its init (the whole pid namespace goes with it), then the holder if it
# did not exit by itself. Only processes that are still what was recorded are killed.
stop_host() {
  local k=$1 f c cs h hs ino
  f=$(host_file "$k")
  c=$(state_get "$f" child) cs=$(state_get "$f" child_start)
  h=$(state_get "$f" holder) hs=$(state_get "$f" holder_start) ino=$(state_get "$f" netns)
  if pid_is "$c" "$cs" "$ino"; then
    show_shm "$k" "$c" || LEFTOVERS=1
    kill -KILL "$c" 2>/dev/null || true
  fi
  if ! wait_gone holder_is "$h" "$hs" "$ino"; then
    kill -KILL "$h" 2>/dev/null || true   # --kill-child takes the host down with it
    wait_gone holder_is "$h" "$hs" "$ino" || warn "host $k: holder $h survived SIGKILL"
  fi
  wait_gone pid_is "$c" "$cs" "$ino" || warn "host $k: init $c survived SIGKILL"
}

# Processes still in a lab namespace were not started by the lab (or are exiting
# `exec` wrappers): wait for them briefly, then name them, never kill them.
report_ns_pids() {
  local ns=$1 i pids=""
  for ((i = 0; i < 5; i++)); do
    pids=$(ip netns pids "$ns" 2>/dev/null | tr '\n' ' ')
    [[ -n $pids ]] || return 0
    sleep 0.2
  done
  warn "$ns still has processes not started by the lab (left alone): $pids"
}

remove_state() {
  [[ -d $STATE ]] || return 0
  rm -f -- "$STATE/lab" "$STATE"/host[0-9] "$STATE"/host[0-9].log "$STATE"/host[0-9].tmp "$STATE/lab.tmp"
  rmdir -- "$STATE" 2>/dev/null || warn "could not remove $STATE (files not made by the lab?)"
}

teardown() {
  local k ns
  for k in $(hosts_recorded); do stop_host "$k"; done
  for ns in $(lab_namespaces); do
    report_ns_pids "$ns"
    ip netns del "$ns" || warn "could not delete namespace $ns"
  done
  remove_state
}

LEFTOVERS=0   # set by stop_host when a host's /dev/shm still held files

# --strict: exit 3 (after tearing everything down) if any host's /dev/shm held files.
cmd_down() {
  local strict=0
  case ${1:-} in --strict) strict=1 ;; "") ;; *) die "down: unknown option '$1'" ;; esac
  require_root_tools
  if ! lab_exists; then
    say "down: nothing is up"
    return 0
  fi
  teardown
  ! lab_exists || die "down: something is left (see: lab.sh check-clean)"
  say "down: done"
  if ((strict && LEFTOVERS)); then
    echo "lab: down --strict: files were left in a host's /dev/shm (listed above)" >&2
    exit 3
  fi
}

# ---------------------------------------------------------------- using

cmd_exec() {
  (($# >= 1)) || usage
  local k=$1 c dir
  shift
  [[ ${1:-} != -- ]] || shift
  (($#)) || die "exec: no command given"
  require_root_tools
  check_host_index "$k"
  c=$(host_child "$k") || die "host $k is not running"
  # The working directory is looked up inside the host's mount namespace (--wdns), so a
  # relative path can never reach the machine's own /dev/shm.
  dir=$PWD
  if [[ ! -d /proc/$c/root$dir ]]; then
    warn "$dir does not exist in host $k; running in /"
    dir=/
  fi
  if nsenter --help 2>&1 | grep -q -- --wdns; then
    exec nsenter -t "$c" -m -u -p -n --wdns="$dir" -- "$@"
  fi
  exec nsenter -t "$c" -m -u -p -n -- sh -c 'cd "$1" || exit 125; shift; exec "$@"' fclab-exec "$dir" "$@"
}

cmd_shape() {
  (($# >= 1 && $# <= 2)) || usage
  local rate=$1 bits k ks
  bits=$(rate_bits "$rate")
  require_root_tools
  if (($# == 2)); then check_host_index "$2"; ks=$2; else ks=$(hosts_recorded); fi
  [[ -n $ks ]] || die "shape: no lab is up"
  for k in $ks; do
    shape_host "$k" "$bits"
    state_set "$(host_file "$k")" rate "$rate"
  done
  (($# == 2)) || state_set "$STATE/lab" rate "$rate"
  say "shape: host(s) $(echo $ks) now at $rate"
}

kill_host() {
  local k=$1 f c
  f=$(host_file "$k")
  if ! c=$(host_child "$k"); then
    say "host $k is already down"
    return 0
  fi
  kill -KILL "$c"
  wait_gone pid_is "$c" "$(state_get "$f" child_start)" "$(state_get "$f" netns)" ||
    die "host $k: init $c survived SIGKILL"
  say "host $k killed (pid namespace of $c gone)"
}

# One-way partition of host K (from/to every peer, or only peer J) with iptables in
# K's namespace. iptables is not installed on every machine: detect, never install.
partition() {
  local kind=$1 k=$2 j=${3:-} ns rule=()
  command -v iptables >/dev/null || {
    echo "lab: fault $kind needs iptables, which is not installed (Debian: apt-get install -y iptables)" >&2
    exit 2
  }
  ns=$(host_ns "$k")
  if [[ -n $j ]]; then check_host_index "$j"; fi
  case $kind in
    drop-in) rule=(-I INPUT -i eth0 ${j:+-s "$(host_addr "$j")"} -j DROP) ;;
    drop-out) rule=(-I OUTPUT -o eth0 ${j:+-d "$(host_addr "$j")"} -j DROP) ;;
    heal)
      ip netns exec "$ns" iptables -w -F INPUT
      ip netns exec "$ns" iptables -w -F OUTPUT
      say "host $k: partitions healed"
      return 0 ;;
  esac
  ip netns exec "$ns" iptables -w "${rule[@]}"
  say "host $k: $kind${j:+ (peer $j only)}"
}

cmd_fault() {
  (($# >= 2 && $# <= 3)) || usage
  local kind=$1 k=$2
  require_root_tools
  check_host_index "$k"
  case $kind in
    link-down | link-up)
      ip -n "$SW" link set "p$k" "${kind#link-}"
      say "host $k: switch port p$k ${kind#link-}" ;;
    kill) kill_host "$k" ;;
    power-loss)
      ip -n "$SW" link set "p$k" down   # first, so that peers see no FIN or RST
      say "host $k: switch port p$k down (power loss)"
      kill_host "$k" ;;
    drop-in | drop-out | heal) partition "$kind" "$k" "${3:-}" ;;
    *) die "fault: unknown kind '$kind' (link-down link-up kill power-loss drop-in drop-out heal)" ;;
  esac
}

# ---------------------------------------------------------------- looking

tc_rate() {
  tc -n "$1" qdisc show dev "$2" root 2>/dev/null |
    awk '$2 == "tbf" { for (i = 1; i < NF; i++) if ($i == "rate") { print $(i + 1); exit } }' |
    grep . || echo none
}

cmd_status() {
  local k f ns c h state link ino
  if ! lab_exists; then
    say "status: no lab is up"
    return 0
  fi
  say "state $STATE: $(state_get "$STATE/lab" hosts) host(s), /dev/shm $(state_get "$STATE/lab" shm) each"
  printf '%-4s %-9s %-12s %-8s %-8s %-5s %-14s %s\n' host netns address tx rx link holder "init (pid ns)"
  for k in $(hosts_recorded); do
    f=$(host_file "$k") ns=$(host_ns "$k") ino=$(state_get "$f" netns)
    h=$(state_get "$f" holder) c=$(state_get "$f" child)
    link=$(ip -n "$SW" -br link show "p$k" 2>/dev/null | awk '{ print tolower($2) }')
    if holder_is "$h" "$(state_get "$f" holder_start)" "$ino"; then h="$h alive"; else h="$h dead"; fi
    if host_child "$k" >/dev/null; then state=alive; else state=dead; fi
    printf '%-4s %-9s %-12s %-8s %-8s %-5s %-14s %s\n' "$k" "$ns" "$(host_addr "$k")" \
      "$(tc_rate "$ns" eth0)" "$(tc_rate "$SW" "p$k")" "${link:-gone}" "$h" "${c:--} $state"
  done
  for ns in $(lab_namespaces); do
    [[ $ns == "$SW" || -e $(host_file "${ns#fclab-h}") ]] || say "stray namespace $ns (not in the state)"
  done
}

cmd_leftovers() {
  local k c found=0
  require_root_tools
  for k in $(hosts_recorded); do
    c=$(host_child "$k") || continue   # a dead host's tmpfs went with it
    show_shm "$k" "$c" || found=1
  done
  ((found == 0)) && say "leftovers: no file in any live host's /dev/shm"
  return "$found"
}

# Holders still running anywhere (found by the tag in their command line; reported only).
tagged_holders() {
  local p args
  for p in /proc/[0-9]*; do
    mapfile -d '' -t args 2>/dev/null <"$p/cmdline" || continue
    [[ ${args[0]:-} == *unshare && " ${args[*]} " == *" $HOLDER_TAG"* ]] && echo "${p#/proc/}"
  done
  true
}

cmd_check_clean() {
  local bad=0 k f c ns pids
  ns=$(lab_namespaces | tr '\n' ' ')
  [[ -z $ns ]] || { echo "lab: left: namespaces $ns"; bad=1; }
  [[ ! -e $STATE ]] || { echo "lab: left: state directory $STATE"; bad=1; }
  for k in $(hosts_recorded); do
    f=$(host_file "$k")
    if holder_is "$(state_get "$f" holder)" "$(state_get "$f" holder_start)" "$(state_get "$f" netns)"; then
      echo "lab: left: host $k holder $(state_get "$f" holder) alive"; bad=1
    fi
    if c=$(host_child "$k"); then echo "lab: left: host $k init $c alive"; bad=1; fi
  done
  pids=$(tagged_holders | tr '\n' ' ')
  [[ -z $pids ]] || { echo "lab: left: holder processes $pids"; bad=1; }
  ((bad == 0)) && say "clean"
  return "$bad"
}

main() {
  (($#)) || usage
  [[ $STATE == /* && $STATE != / && $STATE != *..* ]] || die "FCLAB_STATE must be an absolute path (got '$STATE')"
  local cmd=$1
  shift
  case $cmd in
    up) cmd_up "$@" ;;
    down) cmd_down "$@" ;;
    exec) cmd_exec "$@" ;;
    shape) cmd_shape "$@" ;;
    fault) cmd_fault "$@" ;;
    status) cmd_status ;;
    leftovers) cmd_leftovers ;;
    check-clean) cmd_check_clean ;;
    -h | --help | help) usage 0 ;;
    *) echo "lab: unknown command '$cmd'" >&2; usage ;;
  esac
}

main "$@"
