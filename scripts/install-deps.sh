#!/usr/bin/env bash
# Installs tessera's build and run dependencies from Debian's packages.
# Idempotent: does nothing (and touches no network) when everything is present.
# Works as root or through sudo.
set -euo pipefail

PACKAGES=(
  build-essential cmake pkg-config git
  libboost-dev libboost-system-dev
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libcereal-dev
  libopenmpi-dev openmpi-bin
  libgtest-dev libgmock-dev
  libopenblas-dev libdnnl-dev
  # dnnl-config.cmake (Debian's oneDNN is built with its OpenCL GPU runtime) does
  # find_package(OpenCL REQUIRED); libdnnl-dev only recommends it.
  ocl-icd-opencl-dev
  libcli11-dev libspdlog-dev libfmt-dev nlohmann-json3-dev
  libssl-dev
  clang libclang-rt-14-dev
  gnuplot-nox jq
  procps iproute2
  clang-format clang-tidy
)
# Optional, for the long suite only: TESSERA_DEPS_TORCH=1 adds Debian's
# PyTorch (1.13), which the `long` tests launcher_torch and multihost_torch run
# under `tessera run`, and its C++ headers and pybind11, with which the
# torch.distributed backend (integrations/torch) builds (its tests skip, saying
# why, without them). The default suite and the build never need them.
if [ "${TESSERA_DEPS_TORCH:-0}" = 1 ]; then
  PACKAGES+=(python3-torch libtorch-dev pybind11-dev)
fi

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
    echo "install-deps: missing ${missing[*]}; run as root or install sudo" >&2; exit 1
  fi
fi

echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
