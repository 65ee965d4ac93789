#!/usr/bin/env bash
# The checker passes on docker/ and fails on copies broken one way each.
set -euo pipefail
root="$1"
check="$root/tests/docker/docker_check.py"
python3 "$check" "$root"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
broken() {  # name sed-expression file
  rm -rf "$tmp/d" && cp -r "$root/docker" "$tmp/d"
  sed -i "$2" "$tmp/d/$3"
  if python3 "$check" "$root" "$tmp/d" 2>"$tmp/err"; then
    echo "selftest: checker accepted $1" >&2
    exit 1
  fi
  echo "selftest: rejected $1: $(head -1 "$tmp/err")"
}
broken "another image on a node" 's/^  image: tessera$/  image: tessera:old/' compose.yaml
broken "a build unlike CI's" 's/tessera_build/cmake --build build/' Dockerfile
broken "no install script" 's#RUN scripts/install-deps.sh#RUN true#' Dockerfile
broken "a hostfile naming another node" 's/^node3 /node9 /' hostfile
broken "a duplicate node rank" 's/TESSERA_NODE_RANK: "3"/TESSERA_NODE_RANK: "2"/' compose.yaml
broken "another base image" 's/^FROM debian:12/FROM ubuntu:24.04/' Dockerfile
