#!/usr/bin/env bash
# The whole test suite: installs what is missing, builds (CUDA backend included where nvcc
# exists), then runs every unit and multi-process test through CTest.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$root/experiments/setup.sh"
jobs=$(nproc 2>/dev/null || echo 2)
echo "[tests] running the suite"
ctest --test-dir "$root/build" --output-on-failure -j "$jobs" "$@"
