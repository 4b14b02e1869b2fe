#!/usr/bin/env bash
# The main job: installs what is missing, builds, trains the default model and writes its
# metrics and plots under runs/.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$root/experiments/setup.sh"
run="$root/runs/single/$(date +%Y%m%d-%H%M%S)"
echo "[quickstart] training the default MLP on Fashion-MNIST -> $run"
"$root/build/worker/pslab_worker" train -c "$root/experiments/configs/single.toml" -o "$run"
/usr/bin/python3 "$root/experiments/plot.py" "$run"
echo "[quickstart] metrics: $run/metrics/worker0.jsonl   plots: $run/plots/"
