#!/usr/bin/env bash
# The main job: installs what is missing and builds (experiments/setup.sh), then compares the
# consistency modes (allreduce, bsp, ssp:2, asp) on Fashion-MNIST with one straggler
# (experiments/configs/default.toml) into ./runs/compare/ and says where the comparison table and
# plots are.
#
#   experiments/quickstart.sh [LAUNCHER ARGUMENTS]
#
# Extra arguments go to the launcher (`experiments/launch.py run --help` lists them), e.g.
# --set train.epochs=1 or --max-minutes 20. Exit: 0 every run finished; 1 a run failed (its log
# is named); 2 a bad config or argument; 130/143 interrupted.
set -euo pipefail
if [[ ${1:-} == -h || ${1:-} == --help ]]; then  # (before anything is installed or built)
  sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
  exit 0
fi
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$root/experiments/setup.sh"

echo "[quickstart] comparing the consistency modes: experiments/configs/default.toml"
where=$(mktemp)
trap 'rm -f "$where"' EXIT
status=0
PSLAB_INVOCATION_OUT=$where /usr/bin/python3 "$root/experiments/launch.py" run "$root/experiments/configs/default.toml" \
  --build-dir "$root/build" --keep-going "$@" || status=$?
if ((status == 2 || status == 130 || status == 143)); then exit "$status"; fi  # nothing (more) to show

dir=$(cat "$where")  # this invocation's directory (the launcher wrote it: --runs-dir, --set name=... as given)
if [[ -n $dir && -f $dir/comparison.md ]]; then
  echo "[quickstart] comparison table: $dir/comparison.md (and comparison.csv)"
  plots=()
  for p in seeds convergence bytes throughput step_time staleness; do
    [[ -f $dir/plots/$p.png ]] && plots+=("$p")
  done
  if ((${#plots[@]})); then
    echo "[quickstart] plots:            $dir/plots/{$(IFS=,; echo "${plots[*]}")}.png"
  else
    echo "[quickstart] plots:            none (--no-plots, or no matplotlib: experiments/pslab plot $dir)"
  fi
  echo "[quickstart] each run:         $dir/<run>/ (summary.json, metrics/, logs/, plots/)"
fi
if ((status != 0)); then
  echo "[quickstart] error: at least one run failed (exit $status); its log is named above" >&2
fi
exit "$status"
