#!/usr/bin/env bash
# Benchmarks (never part of the test suite): training throughput of one replica, parameter
# server push+pull over loopback, and all-reduce with 2 ranks. Each writes JSON to
# runs/bench/<name>.json and says where. Run on an otherwise idle machine.
#   experiments/bench.sh [train|ps|allreduce|replicas|client|torch|resnet ...]   (default: the first three;
#   replicas: the default comparison's asp run with and without backups, experiments/bench_replicas.py;
#   client: a PyTorch worker's push+pull against the C++ worker's, tests/bench/bench_client.py;
#   torch: the PyTorch MLP in asp against PyTorch alone, tests/bench/bench_torch_worker.py;
#   resnet: ResNet-8 and -20 training on the CPU against PyTorch's, tests/bench/bench_resnet.py)
set -euo pipefail
if [[ ${1:-} == -h || ${1:-} == --help ]]; then  # (before anything is built)
  sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
  exit 0
fi
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${PSLAB_BUILD:-$root/build}
# Built first, always (incremental: cheap when nothing changed), so that no figure is an old binary's.
if [[ -n ${PSLAB_BUILD:-} ]]; then cmake --build "$build" >/dev/null; else "$root/experiments/setup.sh" >/dev/null; fi
out="$root/runs/bench"
mkdir -p "$out"
which=("$@")
((${#which[@]})) || which=(train ps allreduce)
for b in "${which[@]}"; do
  case "$b" in
    train)     "$build/tests/bench_train" --threads 2 --runs 5 --steps 2000 --json "$out/train.json" ;;
    ps)        "$build/tests/bench_ps" --runs 5 --json "$out/ps.json" ;;
    allreduce) "$build/tests/bench_allreduce" --ranks 2 --runs 5 --steps 1000 --json "$out/allreduce.json" ;;
    replicas)  PSLAB_BUILD="$build" /usr/bin/python3 "$root/experiments/bench_replicas.py" --rounds 5 --json "$out/replicas.json" ;;
    client)    PSLAB_BUILD="$build" /usr/bin/python3 "$root/tests/bench/bench_client.py" --runs 5 --json "$out/client.json" ;;
    torch)     PSLAB_BUILD="$build" /usr/bin/python3 "$root/tests/bench/bench_torch_worker.py" --runs 5 --workers 1,2,4 --json "$out/torch.json" ;;
    resnet)    PSLAB_BUILD="$build" /usr/bin/python3 "$root/tests/bench/bench_resnet.py" speed --rounds 5 --json "$out/resnet.json" ;;
    *) echo "bench.sh: unknown benchmark '$b' (train, ps, allreduce, replicas, client, torch, resnet)" >&2; exit 2 ;;
  esac >/dev/null
  echo "[bench] $b -> $out/$b.json"
done
