#!/usr/bin/env bash
# The virtual cluster's scaling study: experiments/configs/scale.toml (the default comparison's
# model and straggler, every mode) for 4, 16, 64, 256 and 1024 workers, servers = workers / 16
# (at least 2), in simulated time; then plots/scaling.png (staleness, accuracy and samples/s
# against the number of workers) and scaling.md, in runs/scale-study/<stamp>/.
#   experiments/scale.sh [--set KEY=VALUE ...] [WORKERS ...]   (default: 4 16 64 256 1024)
# A worker's step is measured once, before the runs (virtual.compute_ms), so that every point
# uses the same cost model.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [[ ${1:-} == -h || ${1:-} == --help ]]; then sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; exit 0; fi
sets=() counts=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --set) sets+=(--set "$2"); shift 2 ;;
    *) counts+=("$1"); shift ;;
  esac
done
[[ ${#counts[@]} -gt 0 ]] || counts=(4 16 64 256 1024)
out="$root/runs/scale-study/$(date +%Y%m%d-%H%M%S)"
mkdir -p "$out"
runs=()
# The cost model's compute: one measurement for every point (a short run measures it at start).
if ! /usr/bin/python3 "$root/experiments/launch.py" run "$root/experiments/configs/scale.toml" ${sets[@]+"${sets[@]}"} \
    --set 'cluster.mode="allreduce"' --set train.steps=5 --runs-dir "$out/measure" --no-plots > "$out/measure.log" 2>&1; then
  echo "[scale] error: the run that measures a step failed: $out/measure.log" >&2
  exit 1
fi
compute_ms=$(grep -ho "measured here: [0-9.]* ms" "$out"/measure/*/*/*/logs/virtual.log 2>/dev/null | head -1 | awk '{print $3}' || true)
measured=()
if [[ -n $compute_ms ]]; then
  measured=(--set virtual.compute_ms="$compute_ms")
  echo "[scale] a worker's step on this machine: $compute_ms ms (virtual.compute_ms for every point)" >&2
else  # (--set virtual.compute_ms: nothing measured, that value for every point)
  echo "[scale] no step measured: virtual.compute_ms as --set says, for every point" >&2
fi
rm -rf "$out/measure" "$out/measure.log"
for w in "${counts[@]}"; do
  s=$(( w / 16 > 2 ? w / 16 : 2 ))
  echo "[scale] $w workers, $s servers: every mode, simulated" >&2
  /usr/bin/python3 "$root/experiments/launch.py" run "$root/experiments/configs/scale.toml" ${sets[@]+"${sets[@]}"} \
    ${measured[@]+"${measured[@]}"} --set cluster.workers="$w" --set cluster.servers="$s" \
    --runs-dir "$out/w$w" --no-plots --keep-going > "$out/w$w.log" ||
    echo "[scale] $w workers: a run failed ($out/w$w.log); the others are plotted" >&2
  tail -n 9 "$out/w$w.log" | grep '^| ' >&2 || true
  for d in "$out/w$w"/*/2*/mode=*; do [[ -f $d/summary.json ]] && runs+=("$d"); done
done
((${#runs[@]})) || { echo "[scale] error: no run ended (their logs: $out/w*.log)" >&2; exit 1; }
/usr/bin/python3 "$root/experiments/plot.py" "${runs[@]}" --out "$out/plots" --only scaling
/usr/bin/python3 - "$out" "${runs[@]}" <<'PY'
import json, sys, pathlib
out, runs = pathlib.Path(sys.argv[1]), sys.argv[2:]
rows = [json.loads((pathlib.Path(r) / "summary.json").read_text()) for r in runs]
lines = ["| workers | servers | mode | final acc | staleness mean | p99 | samples/s (simulated) | wall (s) |", "|---|---|---|---|---|---|---|---|"]
for s in sorted(rows, key=lambda s: (s["workers"], s["mode"])):
    st = s.get("staleness") or {}
    acc = f"{100 * s['final_test_acc']:.2f}%" if s.get("final_test_acc") is not None else "-"
    ge = "≥" if st.get("capped_at") else ""  # (staleness past the servers' last histogram bucket: bounds)
    mode = s["mode"] + ("" if s["status"] in ("ok", "diverged") else f" ({s['status']}: not plotted)")
    lines.append(f"| {s['workers']} | {s['servers']} | {mode} | {acc} | {ge}{st.get('mean', 0):.2f} | "
                 f"{ge if st.get('p99') == st.get('capped_at') else ''}{st.get('p99', '-')} | "
                 f"{s['samples_per_s'] or 0:,.0f} | {s['wall_s']:.1f} |")
(out / "scaling.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
PY
echo "[scale] plots/scaling.png and scaling.md in $out" >&2
