#!/usr/bin/env bash
# The whole test suite: installs what is missing, builds (CUDA backend included where nvcc
# exists), then runs every unit, multi-process and launcher test through CTest: one GoogleTest
# binary per folder of tests/ (kernels, core, comm, ps, run, server, worker, as the source tree;
# test_seams; test_gpu), one CTest entry per test class of tests/launcher/, and the multi-host,
# bundle and fuzz entries (tests/CMakeLists.txt).
#
#   tests/run.sh [CTEST ARGUMENTS]       e.g. -R 'launcher\.'  or  -E multihost  or  -N (list them)
#
# The multi-host tier needs root and network namespaces (it installs sshd, Slurm and munge where
# they are missing); elsewhere its tests skip, saying why. The GPU tests skip without a GPU:
# tests/gpu.sh checks them on one.
# docs/testing.md says what each part covers.
set -euo pipefail
if [[ ${1:-} == -h || ${1:-} == --help ]]; then  # (before anything is installed or built)
  sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
  exit 0
fi
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$root/experiments/setup.sh"
jobs=$(nproc 2>/dev/null || echo 2)
echo "[tests] running the suite"
ctest --test-dir "$root/build" --output-on-failure -j "$jobs" "$@"
