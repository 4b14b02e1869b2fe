#!/usr/bin/env bash
# The whole test suite: installs what is missing, builds (CUDA backend included where nvcc
# exists), then runs every unit, multi-process and launcher test through CTest: one GoogleTest
# binary per folder of tests/ (kernels, core, comm, ps, run, server, worker, as the source tree;
# test_seams; test_gpu), one CTest entry per test class of tests/launcher/, and the multi-host,
# bundle and fuzz entries (tests/CMakeLists.txt). Arguments go to ctest (e.g. -R 'launcher\.').
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$root/experiments/setup.sh"
jobs=$(nproc 2>/dev/null || echo 2)
echo "[tests] running the suite"
ctest --test-dir "$root/build" --output-on-failure -j "$jobs" "$@"
