#!/usr/bin/env bash
# One command to check every GPU claim of pslab on a machine with a GPU, from a build or from
# an unpacked bundle (experiments/bundle.sh; same layout):
#
#   tests/gpu.sh [--build-dir DIR] [--out DIR] [--quick | --lean] [--only 1,2,8,...] [--budget SECONDS]
#
# Each step runs on its own (this script again, under `timeout`), in the order --only gives, and
# its wall time is printed and kept in OUT/gpu-steps.json. With --budget a step whose estimate
# (below, from the last lent GPU or a guess) no longer fits in what is left is skipped, saying so,
# and a running step is stopped when the budget ends: on a machine lent for minutes, put the
# steps that matter most first. Ctrl-C stops the running step and what it started. Estimates on one H100/H200, seconds (a guess where no GPU has
# measured it yet): 1: 90, 2: 300, 3: 300, 4: 90, 5: 220, 6: 150, 7: 150, 8: 200; with --lean
# (measured on an H200, with a margin; 3 a guess) 1: 20, 2: 200, 4: 20, 5: 40, 6: 40, 7: 40, 8: 70;
# --estimate N=SECONDS (repeatable) replaces one. (Tests: PSLAB_GPU_SH_STEP, a command run with the step's
# number in place of each step.)
#
#   1. the GPU tests (GPU backend against the CPU one, with and without cuDNN, GPU training, NCCL,
#      ranks sharing a GPU) with PSLAB_REQUIRE_GPU=1: a GPU test that cannot run fails instead of
#      skipping (cuDNN from Python's nvidia-cudnn where libcudnn.so.9 is not found otherwise)
#   2. bench_train --device cuda, MLP and CNN at batch 64, 256, 1024 and 4096 and ResNet-20 (batch
#      norm; cuDNN) at 128 and 512, float32 (at each model's smallest batch also without step
#      graphs; the convolutional ones also with the algorithms cuDNN times, PSLAB_CUDNN=timed,
#      instead of its heuristic's; the CNN at 1024 and ResNet-20 at 128 also timed pass by pass,
#      bench_train --profile), and with TF32 at each model's largest batch; and, where `python3 -c "import torch"`
#      works, the same models in PyTorch on the same GPU at its best (tests/bench/torch_train.py: eager, staged and the step
#      in a CUDA graph, ResNet also in channels_last; float32 against float32, TF32 against TF32);
#      one table with the ratios; runs/bench/gpu.json; then the launcher's train role (MLP batch
#      64, 3 epochs) against bench_train's step
#   3. the default comparison with train.device = "cuda" and its 4 workers on this machine's
#      GPUs: all four modes must finish; then again with train.tf32 = true, for the
#      line in results/ on what TF32 changes in accuracy
#   4. the data path on this host's cores: bench_ps over TCP (4 and 16 MiB, pieces against
#      whole shards, the floor and raw ZeroMQ in the same invocation) and shared memory; then
#      bench_ps --device cuda (23.3 MB from and to GPU memory, against one D2H + one H2D copy);
#      runs/bench/gpu-ps-*.json
#   5. the data path of GPU workers: experiments/configs/gpu-datapath.toml (4 workers on this
#      machine's GPU, 2 servers, a 23.3 MB model, asp and bsp, overlap on and off; then overlap
#      on with the servers' threads a CPU run's share of the cores): each run's comm / compute /
#      wait ms per step
#   6. GPUs shared through MPS: the default comparison (no straggler, its 3 epochs) on this GPU with
#      the defaults (cluster.mps = "auto": a private MPS daemon, its 4 workers share the GPU; step
#      graphs) and with cluster.mps = "off" and train.cuda_graphs = "off"
#   7. PyTorch workers on the GPU: experiments/configs/torch-resnet.toml (a ResNet with batch
#      norm, experiments/torch/resnet.py) on cuda, bsp and asp, 4 workers, 1 epoch: both must
#      finish at >= 80% test accuracy; needs a python3 whose PyTorch has CUDA ($PSLAB_TORCH_PYTHON,
#      else python3 on PATH, else /usr/bin/python3), skipped, saying so, without one
#   8. ResNet-20 with batch norm (model.kind = "resnet") on CIFAR-10 on the GPU:
#      experiments/configs/resnet-cifar10.toml, its five modes, 4 workers, 2 epochs: every run must
#      finish; on the real data set ($PSLAB_CIFAR10, else /usr/share/datasets/cifar-10-batches-bin)
#      where present, else on a generated file in its format whose classes differ in colour (then
#      10 epochs, and allreduce, bsp and local SGD must reach 50%, asp and ssp 25%)
# --quick: fewer steps and runs (a smoke test of the command itself). --lean: every check that
# passes or fails and every target ratio, without the variants beside them, so that steps 1, 2, 4,
# 5, 6 and 8 fit in one machine's quarter of an hour: step 2 without PyTorch's staged feed (never
# its best on a GPU) and with ResNet-20 at batch 128 in float32 only; step 4 TCP 4 MiB (raw ZeroMQ
# beside it) and GPU memory over shared memory only; step 5 with the default overlap only; step 6
# in allreduce, bsp and asp (the modes its targets name); step 8 at most 100 steps per worker on
# the real data set. --only: these steps alone, in this order. --out: logs and JSON (default runs/bench).
# Exit: 0 every check that ran passed (the steps the budget left out are named); 1 a check
# failed or a step ran past the budget (named at the end); 2 a bad argument or no build; 77 no GPU
# here (nothing checked); 130 stopped by Ctrl-C.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build="$root/build" quick=0 lean=0 only=1,2,3,4,5,6,7,8 budget=0 out="$root/runs/bench" child=0 estimates=()
estimate=(0 90 300 300 90 220 150 150 200)  # seconds per step (the header says whence)
while (($#)); do
  case $1 in
    --build-dir) build=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --quick) quick=1; shift ;;
    --lean) lean=1; shift ;;
    --only) only=$2; shift 2 ;;
    --budget) budget=$2; shift 2 ;;
    --estimate) estimates+=("$2"); shift 2 ;;
    --one-step) child=1 only=$2; shift 2 ;;  # (internal: what the steps below run as)
    -h|--help) sed -n '2,/^set -uo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ $only =~ ^[1-8](,[1-8])*$ ]] || { echo "gpu.sh: --only $only: step numbers 1-8, comma-separated" >&2; exit 2; }
[[ $budget =~ ^[0-9]+$ ]] || { echo "gpu.sh: --budget $budget: whole seconds" >&2; exit 2; }
((quick && lean)) && { echo "gpu.sh: --quick or --lean, not both" >&2; exit 2; }
((lean)) && estimate=(0 20 200 300 20 40 40 40 70)
for e in "${estimates[@]}"; do
  [[ $e =~ ^([1-8])=([0-9]+)$ ]] || { echo "gpu.sh: --estimate $e: STEP=SECONDS, e.g. 2=150" >&2; exit 2; }
  estimate[BASH_REMATCH[1]]=${BASH_REMATCH[2]}
done
build=$(cd "$build" 2>/dev/null && pwd) || { echo "gpu.sh: no build directory at $build" >&2; exit 2; }
mkdir -p "$out" && out=$(cd "$out" && pwd)
failed=()
step() { echo; echo "=== $*"; }
wanted() { [[ ",$only," == *",$1,"* ]]; }  # step $1 was asked for (--only)

if ((!child)); then
  if ! gpus=$(nvidia-smi -L 2>&1) || [[ -z $gpus ]]; then
    echo "gpu.sh: no GPU here (nvidia-smi -L: ${gpus:-no output}); nothing checked"
    exit 77
  fi
  echo "$gpus"
  # Each step on its own, timed, under the budget; its output also in OUT/gpu-stepN.log.
  # A step runs under `timeout` (no limit without --budget), which gives it a process group of its
  # own: Ctrl-C (or TERM) here reaches only this script, so it is passed on to the step's group.
  start=$SECONDS rows=() bad=() left_out=() step_pid=
  stop_step() {
    trap '' INT TERM
    [[ -n $step_pid ]] && { kill -TERM "$step_pid" 2>/dev/null; wait "$step_pid"; }
    echo; echo "gpu.sh: interrupted during step $n (it and what it started were stopped)"
    exit 130
  }
  trap stop_step INT TERM
  for n in ${only//,/ }; do
    used=$((SECONDS - start)) limit=(timeout -k 20 0)
    if ((budget)); then
      if ((used + estimate[n] > budget)); then
        echo; echo "=== step $n skipped: about ${estimate[n]} s, $((budget - used)) s of --budget $budget left"
        rows+=("$n skipped 0") left_out+=("$n"); continue
      fi
      limit=(timeout -k 20 $((budget - used)))
    fi
    size=(); ((quick)) && size=(--quick); ((lean)) && size=(--lean)
    run_step=("${BASH_SOURCE[0]}" --one-step "$n" --build-dir "$build" --out "$out" "${size[@]}")
    [[ -n ${PSLAB_GPU_SH_STEP:-} ]] && run_step=($PSLAB_GPU_SH_STEP "$n" "${size[@]}")
    t0=$SECONDS
    exec {log}> >(tee "$out/gpu-step$n.log"); tee_pid=$!
    # (in the background, so that the trap runs at once; SIGINT as it was, not ignored as bash
    # leaves it for background commands)
    ( trap - INT QUIT; exec "${limit[@]}" "${run_step[@]}" ) >&$log 2>&1 &
    step_pid=$!
    wait "$step_pid"; rc=$? step_pid= took=$((SECONDS - t0))
    exec {log}>&-; wait "$tee_pid"
    case $rc in
      0) rows+=("$n ok $took") ;;
      77) rows+=("$n skipped $took") left_out+=("$n") ;;  # (nothing here to run it with: it said what)
      124|137) rows+=("$n stopped $took") bad+=("step $n (stopped at the budget's end after $took s)") ;;
      *) rows+=("$n failed $took") bad+=("step $n") ;;
    esac
  done
  echo; echo "=== steps: wall seconds ($( ((budget)) && echo "--budget $budget s" || echo "no --budget"); estimates: tests/gpu.sh's header)"
  printf '%s\n' "${rows[@]}" | awk '{printf "  step %s  %-8s %5d s\n", $1, $2, $3}'
  printf '%s\n' "${rows[@]}" | /usr/bin/python3 -c 'import json, sys
rows = [dict(zip(("step", "status", "seconds"), l.split())) for l in sys.stdin if l.strip()]
for r in rows: r["step"], r["seconds"] = int(r["step"]), int(r["seconds"])
json.dump({"benchmark": "gpu_check_steps", "budget_s": int(sys.argv[2]), "steps": rows}, open(sys.argv[1], "w"), indent=2)' \
    "$out/gpu-steps.json" "$budget"
  if ((${#bad[@]})); then
    echo "gpu.sh: FAILED: ${bad[*]} (logs in $out)"
    exit 1
  fi
  ((${#left_out[@]})) && echo "gpu.sh: not run (the budget, or nothing here to run it with): step ${left_out[*]}"
  echo "gpu.sh: every GPU check that ran passed (logs and JSON in $out)"
  exit 0
fi

# The CUDA plugins the binaries load for a GPU (kernels/cuda_plugin.h): a build's kernels/, a bundle's lib/.
plugins=()
for d in "$build/kernels" "$build/lib"; do
  [[ -f $d/libpslab_cuda.so ]] || continue
  plugins=("$d/libpslab_cuda.so")
  [[ -f $d/libpslab_nccl.so ]] && plugins+=("$d/libpslab_nccl.so")
  break
done
if ((${#plugins[@]} == 0)); then
  echo "gpu.sh: no CUDA plugin (libpslab_cuda.so) in $build/kernels or $build/lib: a build without CUDA?" >&2
  exit 1
fi
if ldd "${plugins[@]}" | grep -q "libnccl.*not found"; then
  nccl=$(python3 -c "import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], 'lib'))" 2>/dev/null)
  if [[ -n $nccl && -e $nccl/libnccl.so.2 ]]; then
    echo "gpu.sh: libnccl.so.2 from $nccl (Python's nvidia-nccl)"
    export LD_LIBRARY_PATH="$nccl${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  fi
fi
# cuDNN (kernels/cuda/cudnn.h), loaded by name at run time: Python's nvidia-cudnn where the loader finds none.
if ! python3 -c "import ctypes; ctypes.CDLL('libcudnn.so.9')" 2>/dev/null; then
  cudnn=$(python3 -c "import nvidia.cudnn, os; print(os.path.join(list(nvidia.cudnn.__path__)[0], 'lib'))" 2>/dev/null)
  if [[ -n $cudnn && -e $cudnn/libcudnn.so.9 ]]; then
    echo "gpu.sh: libcudnn.so.9 from $cudnn (Python's nvidia-cudnn)"
    export LD_LIBRARY_PATH="$cudnn${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  else
    echo "gpu.sh: no libcudnn.so.9 here: GPU convolutions by im2col, and step 1's cuDNN tests fail"
  fi
fi
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib; do
  if ldd "$build/worker/pslab_worker" "${plugins[@]}" | grep -q "not found" && [[ -d $d ]]; then export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d"; fi
done
if ldd "$build/worker/pslab_worker" "${plugins[@]}" | grep "not found"; then
  echo "gpu.sh: pslab_worker or its CUDA plugins cannot load the libraries above (LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-})" >&2
  exit 1
fi

if wanted 1; then  # ---- step 1 ----
step "1. GPU tests (PSLAB_REQUIRE_GPU=1: nothing skips)"
export PSLAB_REQUIRE_GPU=1
bin=test_gpu  # every GPU test: backend, collectives, training (tests/CMakeLists.txt)
if [[ ! -x $build/tests/$bin ]]; then
  failed+=("$bin missing"); echo "missing: $build/tests/$bin"
elif "$build/tests/$bin" > "$out/gpu-$bin.log" 2>&1; then
  echo "ok   $bin ($(grep -o '[0-9]* tests\? from [0-9]* test suites\? ran' "$out/gpu-$bin.log" | head -1))"
else
  failed+=("$bin"); echo "FAIL $bin:"; grep -E "FAILED|Failure|error" "$out/gpu-$bin.log" | head -20
fi
unset PSLAB_REQUIRE_GPU
fi

if wanted 2; then  # ---- step 2 ----
step "2. training throughput, pslab (bench_train --device cuda) and PyTorch on the same GPU"
# pslab: samples per timed run about 500K (MLP) / 200K (CNN) / 40K (ResNet-20), at least 50 steps
# (ResNet: 20); PyTorch: each run about 0.5 s (its feeds differ 10x in speed), every batch of a
# model in one start of Python; 20 warm-up steps both
budget_mlp=500000 budget_cnn=200000 budget_resnet20=40000 runs=3 torch_seconds=0.5
((quick)) && budget_mlp=50000 budget_cnn=10000 budget_resnet20=2000 runs=1 torch_seconds=0.1
torch=0
python3 -c "import torch, numpy; assert torch.cuda.is_available()" 2>/dev/null && torch=1
((torch)) || echo "gpu.sh: no PyTorch with CUDA here (python3 -c 'import torch'): pslab alone"
data="$root/data/fashion-mnist"; [[ -d $data ]] || data=/usr/share/datasets/fashion-mnist
rows=()
# float32 at every batch; TF32 (both sides) at each model's largest, where tensor cores weigh most
for prec in fp32 tf32; do
sfx=""; tf=(); [[ $prec == tf32 ]] && sfx=-tf32 tf=(--tf32)
for model in mlp cnn resnet20; do
  batches="64 256 1024 4096"; [[ $model == resnet20 ]] && batches="128 512"
  ((lean)) && [[ $model == resnet20 ]] && { [[ $prec == tf32 ]] && continue; batches=128; }
  [[ $prec == tf32 ]] && batches=${batches##* }
  feeds=()  # PyTorch's: every one (torch_train.py), or under --lean those that can be its best
  ((lean)) && feeds=(--feeds resident,graph) && [[ $model == resnet20 ]] && feeds=(--feeds resident,graph,graph_channels_last)
  for batch in $batches; do
    budget=$budget_mlp; [[ $model == cnn ]] && budget=$budget_cnn; [[ $model == resnet20 ]] && budget=$budget_resnet20
    least=50; [[ $model == resnet20 ]] && least=20
    s=$((budget / batch)); ((s < least)) && s=$least
    kind=(--model "$model"); [[ $model == resnet20 ]] && kind=(--model resnet --depth 20)
    # (the variants' JSON of an earlier invocation in the same --out: the table reads only this one's)
    rm -f "$out/gpu-pslab-$model-$batch-nographs.json" "$out/gpu-pslab-$model-$batch-timed.json"
    # Where the step's time goes, pass by pass (bench_train --profile), for the CNN at 1024 and ResNet-20 at 128.
    prof=(); [[ $prec == fp32 && ($model == cnn && $batch == 1024 || $model == resnet20 && $batch == 128) ]] && prof=(--profile 20)
    if ! "$build/tests/bench_train" --device cuda "${kind[@]}" "${tf[@]}" --batch "$batch" --steps "$s" --runs "$runs" --warmup 20 \
         --max-batch "$batch" "${prof[@]}" --json "$out/gpu-pslab-$model-$batch$sfx.json" > "$out/gpu-pslab-$model-$batch$sfx.log" 2>&1; then
      failed+=("bench_train $model $batch $prec"); echo "FAIL bench_train $model batch $batch $prec:"; tail -5 "$out/gpu-pslab-$model-$batch$sfx.log"; continue
    fi
    rows+=("$model $batch $prec")
    # The same without step graphs (train.cuda_graphs = "off"), at each model's smallest batch,
    # where launches weigh most: what the graphs gain.
    if [[ $prec == fp32 && $batch == "${batches%% *}" ]] && ! "$build/tests/bench_train" --device cuda "${kind[@]}" \
         --batch "$batch" --steps "$s" --runs "$runs" --warmup 20 --max-batch "$batch" --cuda-graphs off \
         --json "$out/gpu-pslab-$model-$batch-nographs.json" > "$out/gpu-pslab-$model-$batch-nographs.log" 2>&1; then
      failed+=("bench_train $model $batch without step graphs")
    fi
    # Convolutions with the algorithms cuDNN times (PSLAB_CUDNN=timed) against its heuristic's
    # (the default, the row's): what timing them would gain.
    if [[ $prec == fp32 && $model != mlp ]] && ((!quick)) && ! PSLAB_CUDNN=timed "$build/tests/bench_train" --device cuda \
         "${kind[@]}" --batch "$batch" --steps "$s" --runs "$runs" --warmup 20 --max-batch "$batch" \
         --json "$out/gpu-pslab-$model-$batch-timed.json" > "$out/gpu-pslab-$model-$batch-timed.log" 2>&1; then
      failed+=("bench_train $model $batch with the algorithms cuDNN times")
    fi
  done
  if ((torch)) && ! python3 "$root/tests/bench/torch_train.py" --model "$model" --batch "${batches// /,}" --seconds "$torch_seconds" \
       --runs "$runs" --warmup 20 --data "$data" "${tf[@]}" "${feeds[@]}" --json "$out/gpu-torch-$model-{batch}$sfx.json" \
       > "$out/gpu-torch-$model$sfx.log" 2>&1; then
    failed+=("torch_train $model $prec"); echo "FAIL torch_train.py $model $prec:"; tail -5 "$out/gpu-torch-$model$sfx.log"
  fi
done
done
python3 - "$out" "${rows[@]}" <<'EOF'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
table, lines = [], ["| model | batch | precision | pslab cuda (samples/s) | PyTorch (samples/s, feed) | pslab / PyTorch |",
                    "|---|---|---|---|---|---|"]
for row in sys.argv[2:]:
    model, batch, prec = row.split()
    sfx = "-tf32" if prec == "tf32" else ""
    p = json.loads((out / f"gpu-pslab-{model}-{batch}{sfx}.json").read_text())
    t_path = out / f"gpu-torch-{model}-{batch}{sfx}.json"
    t = json.loads(t_path.read_text()) if t_path.exists() else None
    n_path = out / f"gpu-pslab-{model}-{batch}-nographs.json"
    n = json.loads(n_path.read_text()) if n_path.exists() and not sfx else None
    a_path = out / f"gpu-pslab-{model}-{batch}-timed.json"
    a = json.loads(a_path.read_text()) if a_path.exists() and not sfx else None
    r = {"model": model, "batch": int(batch), "precision": prec, "pslab_samples_per_s": p["median_samples_per_s"],
         "pslab_backend": p["backend"], "pslab_graphed_steps": p.get("graphed_steps"),
         "pslab_no_graphs_samples_per_s": n and n["median_samples_per_s"],
         "pslab_timed_algorithms_samples_per_s": a and a["median_samples_per_s"],
         "torch_samples_per_s": t and t["median_samples_per_s"], "torch_feed": t and t["best_feed"],
         "torch_version": t and t["torch"], "ratio": t and p["median_samples_per_s"] / t["median_samples_per_s"]}
    table.append(r)
    graphs = f" (step graphs: {r['pslab_samples_per_s'] / n['median_samples_per_s']:.2f}x)" if n else ""
    graphs += f" (algorithms timed: {a['median_samples_per_s'] / r['pslab_samples_per_s']:.2f}x)" if a else ""
    lines.append(f"| {model} | {batch} | {prec} | {r['pslab_samples_per_s']:,.0f}{graphs} | "
                 + (f"{r['torch_samples_per_s']:,.0f} ({r['torch_feed']}) | {r['ratio']:.2f} |" if t else "- | - |"))
(out / "gpu.json").write_text(json.dumps({"benchmark": "gpu_check", "rows": table}, indent=2) + "\n")
print("\n".join(lines))
compared = [r for r in table if r["ratio"]]
if compared:
    behind = [f"{r['model']} {r['batch']} {r['precision']}" for r in compared if r["ratio"] < 1.0]
    print(f"\npslab at or above PyTorch's best (target 1.0x): {len(compared) - len(behind)} of {len(compared)} rows"
          + (f"; below: {', '.join(behind)}" if behind else ""))
print(f"\n(written: {out / 'gpu.json'})")
EOF
for log in "$out/gpu-pslab-cnn-1024.log" "$out/gpu-pslab-resnet20-128.log"; do  # (bench_train --profile's table)
  [[ -f $log ]] && grep -q "^pass " "$log" && { echo; echo "where a step goes, $(basename "$log" .log):"; sed -n '/^pass /,/^sum /p' "$log"; }
done
# A worker's step in the launcher's train role against bench_train's, MLP batch 64 (at f829795
# 0.43 ms against 0.18 ms): the samples/s of its log windows after the first epoch.
epochs=3; ((quick)) && epochs=1
if "$build/worker/pslab_worker" train --config "$root/experiments/configs/single.toml" --set 'train.device="cuda"' \
     --set "train.epochs=$epochs" --set "data.path=\"$data\"" --out "$out/gpu-train-role" -q > "$out/gpu-train-role.log" 2>&1 &&
   [[ -f $out/gpu-pslab-mlp-64.json ]]; then
  python3 - "$out" <<'EOF'
import json, pathlib, statistics, sys
out = pathlib.Path(sys.argv[1])
lines = [json.loads(l) for l in (out / "gpu-train-role/metrics/worker0.jsonl").read_text().splitlines() if l.strip()]
train = [l for l in lines if l.get("kind") == "train"]
later = [l for l in train if l["epoch"] > 1.0] or train
role = statistics.median(l["samples_per_s"] for l in later)
bench = json.loads((out / "gpu-pslab-mlp-64.json").read_text())["median_samples_per_s"]
print(f"the train role, MLP batch 64: {role:,.0f} samples/s ({64e3 / role:.3f} ms a step), bench_train {bench:,.0f} "
      f"({64e3 / bench:.3f} ms): role / bench_train {role / bench:.2f}x")
EOF
else
  failed+=("train role on cuda"); tail -5 "$out/gpu-train-role.log"
fi
fi

if wanted 3; then  # ---- step 3 ----
step "3. the default comparison on the GPU (train.device = \"cuda\", 4 workers), float32 and TF32"
quick_set=(); ((quick)) && quick_set=(--set train.steps=60)
for tf32 in false true; do
  log="$out/gpu-comparison-tf32-$tf32.log"
  if /usr/bin/python3 "$root/experiments/launch.py" run "$root/experiments/configs/default.toml" --build-dir "$build" \
       --set 'train.device="cuda"' --set "train.tf32=$tf32" --set seed=1 "${quick_set[@]}" --runs-dir "$root/runs/gpu-check-tf32-$tf32" \
       --no-plots --keep-going > "$log" 2>&1; then
    echo "train.tf32 = $tf32:"; grep -E "^\| " "$log"
  else
    failed+=("default comparison on cuda, tf32 $tf32"); grep -v "^\[" "$log" | tail -25
  fi
done
fi

if wanted 4; then  # ---- step 4 ----
step "4. the data path: push+pull over TCP and shared memory on this host (bench_ps)"
ps_runs=5; ((quick)) && ps_runs=1
host_transports="tcp shm" cuda_transports="shm tcp"; ((lean)) && host_transports=tcp cuda_transports=shm
for transport in $host_transports; do
  extra=(--sizes-kib 4096,16384 --pieces); [[ $transport == tcp ]] && extra+=(--floor)
  ((lean)) && extra=(--sizes-kib 4096)  # (raw ZeroMQ is measured beside pslab in every invocation)
  if "$build/tests/bench_ps" --transport "$transport" --runs "$ps_runs" "${extra[@]}" \
       --json "$out/gpu-ps-$transport.json" > "$out/gpu-ps-$transport.log" 2>&1; then
    grep -E "KiB|thread\(s\)" "$out/gpu-ps-$transport.log"
  else
    failed+=("bench_ps $transport"); tail -5 "$out/gpu-ps-$transport.log"
  fi
done
# A GPU worker's push+pull of the 23.3 MB model (22752 KiB): ∇θ from GPU memory, θ back to it,
# against one device-to-host plus one host-to-device copy of it (the target: within 1.5x).
for transport in $cuda_transports; do
  if "$build/tests/bench_ps" --device cuda --transport "$transport" --sizes-kib 22752 --runs "$ps_runs" \
       --json "$out/gpu-ps-cuda-$transport.json" > "$out/gpu-ps-cuda-$transport.log" 2>&1; then
    grep -E "GPU memory|thread\(s\)" "$out/gpu-ps-cuda-$transport.log"
  else
    failed+=("bench_ps --device cuda $transport"); tail -5 "$out/gpu-ps-cuda-$transport.log"
  fi
done
fi

if wanted 5; then  # ---- step 5 ----
step "5. the data path of GPU workers: 4 on this GPU, 2 servers, 23.3 MB model, overlap on and off (--lean: on)"
# Runs gpu-datapath.toml with these --set arguments into runs/$1; prints each run's ms per step.
datapath() {
  local name=$1 log="$out/$1.log"; shift
  if /usr/bin/python3 "$root/experiments/launch.py" run "$root/experiments/configs/gpu-datapath.toml" --build-dir "$build" \
       "$@" --runs-dir "$root/runs/$name" --no-plots --keep-going > "$log" 2>&1; then
    for s in "$root/runs/$name"/gpu-datapath/latest/*/summary.json; do
      /usr/bin/python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); t = d["step_time_ms"]
print("%-24s comm %6.2f  compute %5.2f  wait %5.2f ms/step  %9.0f samples/s  (comm target <= 3 ms: %s)" % (sys.argv[1].split("/")[-2],
      t["comm"], t["compute"], t["wait"], d["samples_per_s"], "met" if t["comm"] <= 3.0 else "not met"))' "$s"
    done
  else
    failed+=("GPU data path ($name)"); grep -v "^\[" "$log" | tail -20
  fi
}
quick5=(); ((quick)) && quick5=(--set train.steps=40)
((lean)) && quick5=(--set cluster.overlap=\"auto\")  # (GPU workers: on)
datapath gpu-datapath "${quick5[@]}"
if ((!lean)); then
  # The servers' threads as a CPU run would share the cores (the host's cores / its 7 processes),
  # against the GPU run's default above (the cores the GPU processes leave).
  share=$(($(nproc) / 7)); ((share < 1)) && share=1
  echo "with cluster.server_threads = $share (the host's cores / its processes), overlap on:"
  datapath gpu-datapath-share --set cluster.overlap=\"auto\" --set "cluster.server_threads=$share" "${quick5[@]}"
fi
fi

if wanted 6; then  # ---- step 6 ----
step "6. GPUs shared through MPS: the default comparison's 4 workers on this GPU, cluster.mps auto against off"
# The default's 3 epochs (one epoch of 4 workers is a quarter of a second on an H100/H200: the
# first steps' set-up, captures and plans then weigh in samples/s as much as the steps).
quick6=(); ((quick)) && quick6=(--set train.steps=60)
((lean)) && quick6+=(--set 'cluster.mode=["allreduce", "bsp", "asp"]')
for mps in auto off; do  # off: without MPS and without step graphs (train.cuda_graphs), as f829795 ran
  log="$out/gpu-mps-$mps.log"
  graphs=auto; [[ $mps == off ]] && graphs=off
  if /usr/bin/python3 "$root/experiments/launch.py" run "$root/experiments/configs/default.toml" --build-dir "$build" \
       --set 'train.device="cuda"' --set seed=1 --set 'straggler.workers=[]' --set "cluster.mps=\"$mps\"" \
       --set "train.cuda_graphs=\"$graphs\"" "${quick6[@]}" \
       --runs-dir "$root/runs/gpu-mps-$mps" --no-plots --keep-going > "$log" 2>&1; then
    echo "cluster.mps = $mps, train.cuda_graphs = $graphs:"; grep -E "MPS|CUDA graphs|^\| " "$log"
  else
    failed+=("default comparison on cuda, cluster.mps $mps"); grep -v "^\[" "$log" | tail -25
  fi
done
# Samples/s with the defaults against without MPS and step graphs, mode by mode, and the targets
# (2x in allreduce and bsp, 1.5x in asp).
/usr/bin/python3 - "$root/runs/gpu-mps-auto" "$root/runs/gpu-mps-off" <<'EOF'
import json, pathlib, sys
def rates(root):
    summaries = (json.loads(p.read_text()) for p in pathlib.Path(root).glob("*/latest/*/summary.json"))
    return {s["mode"]: s.get("samples_per_s") for s in summaries}
auto, off = rates(sys.argv[1]), rates(sys.argv[2])
targets = {"allreduce": 2.0, "bsp": 2.0, "asp": 1.5}
for mode in sorted(set(auto) & set(off)):
    a, o, t = auto[mode], off[mode], targets.get(mode)
    if not a or not o:
        print(f"{mode}: no samples/s to compare (defaults {a}, without MPS and graphs {o})")
        continue
    print(f"{mode:10s} defaults {a:10,.0f}, without MPS and graphs {o:10,.0f} samples/s: {a / o:.2f}x"
          + (f" (target {t}x: {'met' if a / o >= t else 'not met'})" if t else ""))
EOF
fi

if wanted 7; then  # ---- step 7 ----
step "7. PyTorch workers on the GPU: torch-resnet.toml on cuda, bsp and asp, 4 workers"
torch_python=""
for py in ${PSLAB_TORCH_PYTHON:-} python3 /usr/bin/python3; do
  if "$py" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then torch_python=$(command -v "$py"); break; fi
done
if [[ -z $torch_python ]]; then
  echo "skipped: no python3 here has a PyTorch with CUDA (set PSLAB_TORCH_PYTHON to one)"
  nothing_to_run=1
else
  quick7=(--set train.epochs=1.0); ((quick)) && quick7=(--set train.steps=40)
  log="$out/gpu-torch-resnet.log"
  if /usr/bin/python3 "$root/experiments/launch.py" run "$root/experiments/configs/torch-resnet.toml" --build-dir "$build" \
       --set 'train.device="cuda"' --set "worker.python=\"$torch_python\"" "${quick7[@]}" \
       --runs-dir "$root/runs/gpu-torch" --no-plots --keep-going > "$log" 2>&1; then
    grep -E "^\| " "$log"
    if ((!quick)) && ! /usr/bin/python3 -c 'import json, sys
bad = [p for p in sys.argv[1:] if json.load(open(p))["final_test_acc"] < 0.80]
print("below 80%:", bad) if bad else None; sys.exit(1 if bad else 0)' "$root"/runs/gpu-torch/torch-resnet/latest/*/summary.json; then
      failed+=("PyTorch ResNet on cuda below 80%")
    fi
  else
    failed+=("PyTorch ResNet on cuda (torch-resnet.toml)"); grep -v "^\[" "$log" | tail -25
  fi
fi
fi

if wanted 8; then  # ---- step 8 ----
step "8. ResNet-20 on CIFAR-10 on the GPU: resnet-cifar10.toml, five modes, 4 workers"
cifar=${PSLAB_CIFAR10:-/usr/share/datasets/cifar-10-batches-bin} generated=0
if [[ ! -f $cifar/data_batch_1.bin ]]; then
  cifar="$out/cifar10-generated" generated=1
  echo "no CIFAR-10 at ${PSLAB_CIFAR10:-/usr/share/datasets/cifar-10-batches-bin}: a generated file in its format ($cifar)"
  /usr/bin/python3 - "$cifar" <<'PY'
import os, random, sys
os.makedirs(sys.argv[1], exist_ok=True)
rng = random.Random(1)
def write(name, n):  # records: label byte, then 3 x 32 x 32 bytes; class c: channel means from c
    with open(os.path.join(sys.argv[1], name), "wb") as f:
        for _ in range(n):
            c = rng.randrange(10)
            means = (25 * c, 250 - 25 * c, 120 + (c % 3) * 40)
            f.write(bytes([c]) + b"".join(bytes(min(255, max(0, m + rng.randrange(-60, 61))) for _ in range(1024)) for m in means))
write("data_batch_1.bin", 10000)
write("test_batch.bin", 2000)
PY
fi
# (The generated file has 10,000 images, a fifth of CIFAR-10's: 10 epochs, about 200 steps a
# worker; 2 epochs on the real set.)
quick8=(--set train.epochs=2.0); ((generated)) && quick8=(--set train.epochs=10.0); ((quick)) && quick8=(--set train.steps=30)
((lean && !generated)) && quick8=(--set train.steps=100)
log="$out/gpu-resnet-cifar10.log"
if /usr/bin/python3 "$root/experiments/launch.py" run "$root/experiments/configs/resnet-cifar10.toml" --build-dir "$build" \
     --set "data.path=\"$cifar\"" --set cluster.workers=4 "${quick8[@]}" \
     --runs-dir "$root/runs/gpu-resnet" --no-plots --keep-going > "$log" 2>&1; then
  grep -E "^\| " "$log"
  if ((generated && !quick)) && ! /usr/bin/python3 -c 'import json, os, sys
def least(mode):  # stale momentum steps leave asp and ssp noisy in so few steps (asp on CPU: 59% at 10 epochs, 41% at 20)
    return 0.25 if mode == "asp" or mode.startswith("ssp") else 0.50
def said(s):
    acc = s.get("final_test_acc")
    return s["mode"] + " " + ("no accuracy" if acc is None else format(acc, ".1%")) + " (least " + format(least(s["mode"]), ".0%") + ")"
runs = [json.load(open(p)) for p in sys.argv[1:] if os.path.exists(p)]
bad = [said(s) for s in runs if s.get("final_test_acc") is None or s["final_test_acc"] < least(s["mode"])]
print("below its least:", ", ".join(bad)) if bad else None
print(f"summaries: {len(runs)} of the 5 modes") if len(runs) < 5 else None
sys.exit(1 if bad or len(runs) < 5 else 0)' "$root"/runs/gpu-resnet/resnet-cifar10/latest/*/summary.json; then
    failed+=("ResNet-20 on the generated CIFAR-10: a mode below its least accuracy, or without a summary")
  fi
else
  failed+=("ResNet-20 on CIFAR-10 on cuda (resnet-cifar10.toml)"); grep -v "^\[" "$log" | tail -25
fi
fi

echo
if ((${#failed[@]})); then
  echo "gpu.sh: FAILED: ${failed[*]} (logs in $out)"
  exit 1
fi
if ((${nothing_to_run:-0})); then  # (a step run alone: its parent lists it as skipped)
  echo "gpu.sh: skipped (it said why), nothing failed (logs in $out)"
  exit 77
fi
echo "gpu.sh: every GPU check passed (logs and gpu.json in $out)"
