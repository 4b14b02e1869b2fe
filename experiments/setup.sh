#!/usr/bin/env bash
# Installs what is missing (Debian 12 packages) and builds pslab into build/.
# Both README commands (experiments/quickstart.sh, tests/run.sh) start here, so a fresh clone
# needs nothing else. Re-running is cheap: nothing is installed twice, the build is incremental.
set -euo pipefail
if [[ ${1:-} == -h || ${1:-} == --help ]]; then  # (before anything is installed or built)
  sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
  exit 0
fi
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

packages=(
  cmake ninja-build pkg-config g++ zlib1g-dev
  libzmq3-dev cppzmq-dev libflatbuffers-dev flatbuffers-compiler libgloo-dev libopenblas-dev
  libdnnl-dev ocl-icd-opencl-dev  # (oneDNN: the CPU backend's convolutions; its CMake config needs OpenCL's)
  libtomlplusplus-dev nlohmann-json3-dev libcli11-dev libgtest-dev patchelf clang libclang-rt-14-dev
  dataset-fashion-mnist python3 python3-matplotlib python3-numpy
  python3-torch  # (CPU PyTorch: the PyTorch workers, experiments/torch/, and their tests)
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "[setup] installing ${#missing[@]} missing Debian packages: ${missing[*]}"
  sudo=()
  if [[ $(id -u) != 0 ]]; then
    command -v sudo >/dev/null || { echo "[setup] error: not root and no sudo; install as root: apt-get install ${missing[*]}" >&2; exit 1; }
    sudo=(sudo)
  fi
  "${sudo[@]}" apt-get update -qq
  # (env after sudo: sudo's env_reset drops a variable set before it, and a hidden debconf question would wait)
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    -o DPkg::Lock::Timeout=300 "${missing[@]}" >/dev/null
fi

jobs=$(nproc 2>/dev/null || echo 2)
if [[ ! -f "$root/build/build.ninja" ]]; then
  echo "[setup] configuring build/ (the CUDA backend is built when nvcc is found)"
  if ! cmake -S "$root" -B "$root/build" -G Ninja -DCMAKE_BUILD_TYPE=Release >"$root/build.configure.log" 2>&1; then
    cat "$root/build.configure.log" >&2
    echo "[setup] error: cmake could not configure the build (log above)" >&2
    exit 1
  fi
  grep -E "^-- pslab:" "$root/build.configure.log" || true
  mv "$root/build.configure.log" "$root/build/configure.log"
fi
echo "[setup] building with $jobs jobs"
cmake --build "$root/build" -j "$jobs"
