# The multi-host test rig (sourced by tests/multihost/*.sh; needs root).
#
# rig_up K makes K test hosts mh0..mh(K-1). Each is a network namespace plus
# its own PID, UTS (host name), mount and IPC namespaces, held by one process
# (`sleep`, PID 1 of the host's PID namespace); in its mount namespace it has
# a private tmpfs on /dev/shm and an /etc/hosts naming the rig's hosts. So the
# hosts share only the file system (like a cluster's shared home) and the
# kernel's boot id; not process ids, host names, shared memory or network.
# The network: one more namespace holds a bridge; each host has a veth pair
# (eth0 inside the host, its peer on the bridge) with address 10.77.0.(i+1)/24.
# Nothing is added to the root network namespace: the only addresses are
# inside the rig's own namespaces, so test traffic cannot leave them.
#
# rig_exec I CMD...  runs CMD inside host I (all of its namespaces, same cwd).
# rig_head CMD...    runs CMD on the head node: the bridge's network
#                    namespace (address .254), root PID and mount namespaces;
#                    where mpirun runs, as on a cluster's login node.
# rig_agent          path of the launch agent for mpirun (plm_rsh_agent).
# rig_down           kills every process of the rig (PID 1 of each host's PID
#                    namespace, which takes the rest along) and deletes the
#                    namespaces; rig_up installs it as an EXIT/INT/TERM trap,
#                    and also removes rigs left by a test that was SIGKILLed.
#
# Names: namespaces are tsrmh-<pid of the test>-h<i> and -br, so concurrent
# tests never meet.
#
# Delay (opt-in): with RIG_DELAY_US=N set before rig_up, every packet between
# the hosts (and the head node) is held N microseconds on its way. This
# kernel has no sch_netem (nor sch_fq/sch_etf for an EDT delay from a tc BPF
# program: "Specified qdisc kind is unknown"), so the hosts' eth0 are then
# TUN devices and the wire is a process, tests/multihost/rig_wire.cc
# ($RIG_WIRE: the built tessera_rig_wire), that forwards each packet to its
# destination N us after reading it. The bridge and veth pairs are not made.
# TCP between the hosts then uses cubic (a route attribute; see rig_up).
#
# No DNS (opt-in): with RIG_NO_DNS=1 set before rig_up, host i's /etc/hosts
# names only itself, as Debian's does (`127.0.1.1 mhI`): no host name
# resolves to an address another host can reach, as on clusters without DNS
# for their nodes.
#
# CPUs (opt-in): with RIG_HOST_CPUS=1 set before rig_up, everything rig_exec
# starts on host I is confined (taskset) to the I-th (mod their number) of
# the CPUs the test may use, so the test hosts do not compete for each
# other's cores, as machines do not (2 hosts on 2 cores: a core each). With
# the delayed wire and 2 hosts, the wire forwards each host's packets on the
# core of the host they go to, as that host's own network stack would run.

RIG_SUBNET_PREFIX=10.77.0
RIG_HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

# Exit code ctest treats as "skipped" (SKIP_RETURN_CODE).
RIG_SKIP=77

rig_can_run() {
  if [ "$(id -u)" -ne 0 ]; then
    echo "not root: cannot create network namespaces"
    return 1
  fi
  for t in ip unshare nsenter taskset; do
    command -v "$t" >/dev/null || {
      echo "missing $t (iproute2 / util-linux)"
      return 1
    }
  done
  local probe="tsrmh-probe-$$"
  if ! ip netns add "$probe" 2>/dev/null; then
    echo "ip netns add failed (no CAP_SYS_ADMIN or no network namespaces)"
    return 1
  fi
  ip netns del "$probe"
  return 0
}

# Removes rigs whose test process no longer exists (a test killed by SIGKILL
# cannot run its trap).
rig_reap_stale() {
  local ns pid
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep '^tsrmh-[0-9]*-' || true); do
    pid="${ns#tsrmh-}"
    pid="${pid%%-*}"
    [ -d "/proc/$pid" ] && continue
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
  done
}

rig_up() {
  RIG_K="$1"
  RIG_NAME="tsrmh-$$"
  RIG_DIR="$(mktemp -d /tmp/tessera-rig.XXXXXX)"
  export RIG_DIR
  RIG_HOLDERS=()
  RIG_PIDS=()
  trap rig_down EXIT
  trap 'rig_down; exit 130' INT
  trap 'rig_down; exit 143' TERM
  rig_reap_stale
  # The CPUs this test may run on (its affinity), for RIG_HOST_CPUS.
  RIG_PIN="${RIG_HOST_CPUS:-}"
  read -r -a RIG_CPU_LIST <<<"$(python3 -c 'import os; print(*sorted(os.sched_getaffinity(0)))')"
  local br="$RIG_NAME-br"
  local delayed="${RIG_DELAY_US:-}" wire_args=()
  ip netns add "$br"
  ip -n "$br" link set lo up
  if [ -n "$delayed" ]; then
    [ -x "${RIG_WIRE:-}" ] || {
      echo "rig: RIG_DELAY_US needs RIG_WIRE, the path of the built tessera_rig_wire" >&2
      return 1
    }
    ip -n "$br" tuntap add dev br0 mode tun
    ip -n "$br" link set br0 mtu 65520
    wire_args+=("/run/netns/$br=$RIG_SUBNET_PREFIX.254")
  else
    ip -n "$br" link add br0 type bridge
  fi
  ip -n "$br" link set br0 up
  # The bridge's namespace doubles as the rig's head node (like a cluster's
  # login node): mpirun runs there and starts its daemons on the hosts
  # through the launch agent. It keeps the root PID and mount namespaces, so
  # the agent can enter any host.
  ip -n "$br" addr add "$RIG_SUBNET_PREFIX.254/24" dev br0
  {
    echo "127.0.0.1 localhost"
    for ((i = 0; i < RIG_K; ++i)); do echo "$RIG_SUBNET_PREFIX.$((i + 1)) mh$i"; done
  } >"$RIG_DIR/hosts"
  for ((i = 0; i < RIG_K; ++i)); do
    if [ -n "${RIG_NO_DNS:-}" ]; then
      printf '127.0.0.1 localhost\n127.0.1.1 mh%d\n' "$i" >"$RIG_DIR/hosts.$i"
    else
      cp "$RIG_DIR/hosts" "$RIG_DIR/hosts.$i"
    fi
  done
  for ((i = 0; i < RIG_K; ++i)); do
    local ns="$RIG_NAME-h$i"
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    if [ -n "$delayed" ]; then
      ip -n "$ns" tuntap add dev eth0 mode tun
      ip -n "$ns" link set eth0 mtu 65520
      # With a core per host and 2 hosts, what host i sends is forwarded on
      # the other host's core (rig_wire.cc says why).
      local on=""
      [ -n "$RIG_PIN" ] && [ "$RIG_K" = 2 ] && on="@${RIG_CPU_LIST[$(((1 - i) % ${#RIG_CPU_LIST[@]}))]}"
      wire_args+=("/run/netns/$ns=$RIG_SUBNET_PREFIX.$((i + 1))$on")
    else
      # Both ends are created inside the host's namespace, then one end moves to
      # the bridge's: neither ever exists in the root namespace.
      ip -n "$ns" link add eth0 type veth peer name "v$i"
      ip -n "$ns" link set "v$i" netns "$br"
      ip -n "$br" link set "v$i" master br0
      ip -n "$br" link set "v$i" up
    fi
    ip -n "$ns" addr add "$RIG_SUBNET_PREFIX.$((i + 1))/24" dev eth0
    ip -n "$ns" link set eth0 up
    if [ -n "$delayed" ]; then
      # TCP between the hosts uses cubic (Debian's default) rather than this
      # kernel's default, BBR: BBR paces a message's segments with a timer,
      # and a 64 KiB message (with its 16-byte header one segment more than
      # the 65520-byte MTU holds) then waited for a late timer wake-up on
      # top of the delay (a 2 x 2 all-reduce of 64 KiB: 520 us, 320 us with
      # cubic). Best effort: the rig runs without it.
      ip -n "$ns" route replace "$RIG_SUBNET_PREFIX.0/24" dev eth0 congctl cubic 2>/dev/null ||
        echo "rig: cannot make TCP use cubic on mh$i (BBR's pacing then adds to the delay)" >&2
    fi
    ip netns exec "$ns" unshare --pid --fork --uts --mount --ipc --mount-proc --propagation private \
      bash -c 'hostname "$1" && mount -t tmpfs -o size=1g,mode=1777 tmpfs /dev/shm &&
               mount --bind "$2" /etc/hosts && : >"$3" && exec sleep infinity' \
      _ "mh$i" "$RIG_DIR/hosts.$i" "$RIG_DIR/mh$i.ready" </dev/null >/dev/null 2>&1 &
    RIG_HOLDERS+=($!)
  done
  if [ -n "$delayed" ]; then
    "$RIG_WIRE" "$delayed" "$RIG_DIR/wire.ready" "${wire_args[@]}" </dev/null >"$RIG_DIR/wire.log" 2>&1 &
    RIG_HOLDERS+=($!)
    local n
    for ((n = 0; n < 100; ++n)); do
      [ -e "$RIG_DIR/wire.ready" ] && break
      sleep 0.05
    done
    if [ ! -e "$RIG_DIR/wire.ready" ]; then
      echo "rig: the delayed wire did not come up: $(cat "$RIG_DIR/wire.log")" >&2
      return 1
    fi
  fi
  # PID 1 of each host's PID namespace (the child of `unshare --fork`).
  for ((i = 0; i < RIG_K; ++i)); do
    local u="${RIG_HOLDERS[$i]}" child="" n
    for ((n = 0; n < 100; ++n)); do
      if [ -e "$RIG_DIR/mh$i.ready" ]; then
        child="$(cat "/proc/$u/task/$u/children" 2>/dev/null | awk '{print $1}')"
        [ -n "$child" ] && break
      fi
      sleep 0.05
    done
    if [ -z "$child" ]; then
      echo "rig: host mh$i did not come up" >&2
      return 1
    fi
    RIG_PIDS+=("$child")
    echo "$child" >"$RIG_DIR/mh$i.pid"
  done
}

rig_exec() {
  local i="$1" pin=()
  shift
  [ -n "${RIG_PIN:-}" ] && pin=(taskset -c "${RIG_CPU_LIST[$((i % ${#RIG_CPU_LIST[@]}))]}")
  nsenter -t "${RIG_PIDS[$i]}" -n -p -u -m -i -- "${pin[@]}" bash -c 'cd "$0" && exec "$@"' "$PWD" "$@"
}

# Like rig_exec, in the background; prints nothing (use $!).
rig_spawn() {
  rig_exec "$@" &
}

rig_head() { ip netns exec "$RIG_NAME-br" "$@"; }

rig_agent() { echo "$RIG_HERE/rig_agent.sh"; }

# The host's interface (eth0 inside host I) up or down: a cut cable.
rig_link() { ip -n "$RIG_NAME-h$1" link set eth0 "$2"; }

rig_down() {
  trap - EXIT INT TERM
  local p
  for p in "${RIG_PIDS[@]:-}"; do [ -n "$p" ] && kill -KILL "$p" 2>/dev/null; done
  for p in "${RIG_HOLDERS[@]:-}"; do [ -n "$p" ] && kill -KILL "$p" 2>/dev/null; done
  for p in "${RIG_HOLDERS[@]:-}"; do [ -n "$p" ] && wait "$p" 2>/dev/null; done
  if [ -n "${RIG_NAME:-}" ]; then
    for ((i = 0; i < ${RIG_K:-0}; ++i)); do
      for p in $(ip netns pids "$RIG_NAME-h$i" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
      ip netns del "$RIG_NAME-h$i" 2>/dev/null
    done
    ip netns del "$RIG_NAME-br" 2>/dev/null
  fi
  [ -n "${RIG_DIR:-}" ] && rm -rf "$RIG_DIR"
  RIG_PIDS=()
  RIG_HOLDERS=()
  RIG_NAME=""
  RIG_PIN=""
  return 0
}
