#!/usr/bin/env bash
# mpirun's launch agent for the multi-host rig (tests/multihost/rig.sh), used
# in place of ssh: `mpirun --mca plm_rsh_agent tests/multihost/rig_agent.sh`.
# OpenMPI calls it as `AGENT [options] HOST COMMAND...`, as it would ssh; it
# enters host HOST's namespaces (the PID in $RIG_DIR/HOST.pid) and runs
# COMMAND there with /bin/sh, as sshd would. Options before HOST are ignored.
set -euo pipefail
while [ $# -gt 0 ] && [ "${1#-}" != "$1" ]; do shift; done
host="${1:?usage: rig_agent.sh HOST COMMAND...}"
shift
pidfile="${RIG_DIR:?RIG_DIR is not set (run under tests/multihost/rig.sh)}/$host.pid"
[ -r "$pidfile" ] || {
  echo "rig_agent.sh: no rig host '$host' (no $pidfile)" >&2
  exit 255
}
exec nsenter -t "$(cat "$pidfile")" -n -p -u -m -i -- /bin/sh -c "cd / && $*"
