#!/usr/bin/env python3
"""Checks docker/ without a Docker engine: the Dockerfile installs and builds
exactly as CI does (.ci/run -> scripts/test.sh -> tessera_build with
CI=true), and the compose file parses, runs that image on every node, and
agrees with the shared hostfile. Usage: docker_check.py REPO_ROOT [DOCKER_DIR]"""
import os
import re
import sys

root = sys.argv[1]
ddir = sys.argv[2] if len(sys.argv) > 2 else os.path.join(root, "docker")
errors = []


def need(cond, what):
    if not cond:
        errors.append(what)


def read(path):
    with open(path) as f:
        return f.read()


# ---- Dockerfile against CI
dockerfile = read(os.path.join(ddir, "Dockerfile"))
lines = [l for l in re.sub(r"\\\n", " ", dockerfile).splitlines() if l.strip() and not l.lstrip().startswith("#")]
froms = [l.split()[1] for l in lines if l.upper().startswith("FROM ")]
need(froms == ["debian:12"], "Dockerfile: base image is %s, not debian:12" % froms)
runs = [l[4:] for l in lines if l.upper().startswith("RUN ")]
envs = " ".join(l for l in lines if l.upper().startswith("ENV "))
ci = read(os.path.join(root, ".ci", "run"))
test_sh = read(os.path.join(root, "scripts", "test.sh"))
common = read(os.path.join(root, "scripts", "common.sh"))
need("CI=true" in ci and "scripts/test.sh" in ci, ".ci/run no longer runs scripts/test.sh with CI=true")
need(re.search(r"^\s*tessera_build\s*$", test_sh, re.M), "scripts/test.sh no longer calls tessera_build")
need('"$ROOT/scripts/install-deps.sh"' in common, "tessera_build no longer runs scripts/install-deps.sh")
need(any(re.match(r"\s*scripts/install-deps\.sh(\s|$)", r) for r in runs),
     "Dockerfile: no RUN starts with scripts/install-deps.sh")
need(any("source scripts/common.sh" in r and "tessera_build" in r for r in runs),
     "Dockerfile: the build is not tessera_build of scripts/common.sh (what CI runs)")
need(re.search(r"\bCI=true\b", envs), "Dockerfile: CI=true is not set for the build, as .ci/run sets it")
need(not any(re.search(r"\bcmake\b", r) for r in runs), "Dockerfile: runs cmake itself instead of CI's build")
copies = [l.split()[1:] for l in lines if l.upper().startswith("COPY ")]
need(["docker/entrypoint.sh", "/usr/local/bin/tessera-node"] in copies, "Dockerfile: entrypoint not installed")
tag = re.search(r"docker build -f docker/Dockerfile -t (\S+) \.", dockerfile)
need(tag, "Dockerfile: the header does not say the docker build command and tag")
image = tag.group(1) if tag else None

# ---- compose file
compose_text = read(os.path.join(ddir, "compose.yaml"))
try:
    import yaml  # Debian: python3-yaml

    compose = yaml.safe_load(compose_text)
except ImportError:
    compose = None
    print("docker_check: python3-yaml missing, structural check only")
if compose is not None:
    services = compose.get("services") or {}
    need(len(services) >= 2, "compose: fewer than 2 nodes")
    ranks = []
    hosts = []
    for name, s in services.items():
        need(s.get("image") == image, "compose: service %s runs image %r, the Dockerfile builds %r" % (name, s.get("image"), image))
        need(s.get("command") == ["tessera-node"], "compose: service %s does not start tessera-node (sshd)" % name)
        env = s.get("environment") or {}
        need("TESSERA_JOB_TOKEN" in env, "compose: service %s has no TESSERA_JOB_TOKEN" % name)
        need(str(env.get("TESSERA_NNODES")) == str(len(services)),
             "compose: service %s says TESSERA_NNODES=%s for %d nodes" % (name, env.get("TESSERA_NNODES"), len(services)))
        ranks.append(int(env.get("TESSERA_NODE_RANK", -1)))
        hosts.append(s.get("hostname"))
        vols = s.get("volumes") or []
        need(any(str(v).endswith(":/cluster/hostfile:ro") for v in vols), "compose: %s lacks the shared hostfile" % name)
        need(any(str(v).startswith("cluster:/cluster") for v in vols), "compose: %s lacks the shared /cluster volume" % name)
    need(sorted(ranks) == list(range(len(services))), "compose: node ranks %s are not 0..N-1" % ranks)
    hostfile = [l.split()[0] for l in read(os.path.join(ddir, "hostfile")).splitlines() if l.strip() and not l.startswith("#")]
    need(hostfile == hosts, "hostfile lists %s, compose's hostnames are %s" % (hostfile, hosts))
else:
    need(re.search(r"^services:\s*$", compose_text, re.M), "compose: no services")
    need(re.search(r"^\s+image:\s*%s\s*$" % re.escape(image or "?"), compose_text, re.M), "compose: image is not %s" % image)

if errors:
    for e in errors:
        print("docker_check: " + e, file=sys.stderr)
    sys.exit(1)
print("docker_check: Dockerfile, compose.yaml and hostfile agree with CI (%s)" % ddir)
