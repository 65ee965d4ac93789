#!/usr/bin/env bash
# Starts one node of the docker/compose.yaml cluster: node 0 makes the
# cluster's ssh key in the shared volume, every node trusts it and runs sshd
# in the foreground, so `mpirun --hostfile /cluster/hostfile` (ssh) and
# `tessera run --nnodes N` (run on each node) can reach every container.
set -euo pipefail
shared=/cluster/ssh
mkdir -p "$shared" /root/.ssh /run/sshd
if [ "${TESSERA_NODE_RANK:-0}" = "0" ] && [ ! -f "$shared/id_ed25519" ]; then
  ssh-keygen -q -t ed25519 -N '' -f "$shared/id_ed25519.tmp"
  mv "$shared/id_ed25519.tmp.pub" "$shared/id_ed25519.pub"
  mv "$shared/id_ed25519.tmp" "$shared/id_ed25519"
fi
for _ in $(seq 120); do [ -f "$shared/id_ed25519" ] && break; sleep 1; done
[ -f "$shared/id_ed25519" ] || { echo "tessera-node: no cluster key in $shared after 120 s (is node 0 up?)" >&2; exit 1; }
install -m 600 "$shared/id_ed25519" /root/.ssh/id_ed25519
install -m 644 "$shared/id_ed25519.pub" /root/.ssh/authorized_keys
printf 'Host *\n  StrictHostKeyChecking accept-new\n  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n' >/root/.ssh/config
exec /usr/sbin/sshd -D -e
