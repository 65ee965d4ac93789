"""Starts N local ranks of a Python script with torchrun's variables set.

Debian's torchrun of torch 1.13 fails at start on Python 3.11, so the
tests, the example and the benchmark start their ranks with this instead:
RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT
(a free port) are set for each child, which then calls
torch.distributed.init_process_group(backend) with env://.
"""
import os
import socket
import subprocess
import sys
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(argv, nproc, timeout=240, env_extra=None):
    """Runs `python argv...` as nproc ranks; returns [(exit code, output)] per rank.

    A rank still running after `timeout` seconds is killed (exit code None):
    no test hangs.
    """
    port = str(free_port())
    procs = []
    for r in range(nproc):
        env = dict(os.environ)
        env.update(RANK=str(r), WORLD_SIZE=str(nproc), LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(nproc),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        env.update(env_extra or {})
        procs.append(subprocess.Popen([sys.executable] + list(argv), env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    deadline = time.monotonic() + timeout
    results = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            results.append((p.returncode, out))
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
            results.append((None, out + "\n[killed after %d s: hung]" % timeout))
    return results


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit("usage: launch.py NPROC SCRIPT [ARGS...]")
    res = launch(sys.argv[2:], int(sys.argv[1]))
    for r, (code, out) in enumerate(res):
        sys.stdout.write("--- rank %d (exit %s)\n%s" % (r, code, out))
    sys.exit(0 if all(code == 0 for code, _ in res) else 1)
