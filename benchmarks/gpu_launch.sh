#!/usr/bin/env bash
# Table 1 through the service itself on a lent GPU machine: Ray Tune, the stacked seeds, GPU
# fractions, MLflow, the report beside the paper. Its image has no Ray, Optuna or MLflow, so the
# call carries them (built here first by `bash benchmarks/device_overlay.sh`, with
# `carry: [".device"]`), and runs:
#
#   bash benchmarks/gpu_launch.sh [OUT_DIR]
#
# A lease is 15 minutes, and Table 1's NDR rows alone take about 40 on an H200, so by default
# this runs a short Table 1: ablations/ndr_table1.yaml with its models cut to MODELS (default: the
# LSTM, which packs four trials to a GPU, the Transformer and NDR) and its tasks to VARIANTS (default
# both: ctl_forward,ctl_backward), N_ITERS iterations per trial (default 2000) and an evaluation
# every EVAL_EVERY (default 1000). N_ITERS=30000 MODELS=... runs
# the rows at the paper's length, where the time allows; LAUNCH_ARGS go to `orchestrator launch`
# (`--address HOST:PORT` to join a cluster instead of starting Ray here). GPU_PER_TRIAL=F gives each
# Transformer and NDR trial F of a GPU instead of the file's quarter (the LSTMs keep their own
# per_model quarter). Writes into OUT_DIR
# (default ./gpu-out):
#   launch.txt   the launch's console (its plan, progress and answer)
#   status.txt   `orchestrator status`: trials per pair and the best so far
#   report.txt   `orchestrator report`'s console; report.md and report.html (its plots inside): the
#                cells over seeds beside Table 1
#   runs.csv     `orchestrator export`: a row per trial run, its config and last metrics
#   gpu.csv      nvidia-smi every 2 s during the launch: utilisation and memory (launch.txt ends with its busy samples' mean)
#   dry_run.txt  with DRY_RUN_LIMIT_S=S: the whole Table 1's plan and GPU-hours on this machine
#                (`launch --dry-run`, calibrated here), after the launch, cut off after S seconds
set -u
out=${1:-gpu-out}
mkdir -p "$out"
py=${PYTHON:-python3}
overlay=${OVERLAY_DIR:-/tmp/sysgen-overlay}
mkdir -p "$overlay"
start=$SECONDS
tar -xJf .device/overlay.tar.xz -C "$overlay" || { echo "no .device/overlay.tar.xz: build it with benchmarks/device_overlay.sh and carry .device"; exit 2; }
echo "overlay unpacked in $((SECONDS - start)) s"
export PYTHONUNBUFFERED=1 PYTHONPATH="$overlay:$PWD${PYTHONPATH:+:$PYTHONPATH}"
"$py" -c 'import ray, optuna, mlflow, torch; print("ray", ray.__version__, "optuna", optuna.__version__, "mlflow", mlflow.__version__,
                                                 "torch", torch.__version__, "cuda", torch.cuda.is_available())' || exit 1

file=$(mktemp -d)/ndr_table1_short.yaml
VARIANTS=${VARIANTS:-} GPU_PER_TRIAL=${GPU_PER_TRIAL:-} MODELS=${MODELS:-lstm,transformer,ndr} N_ITERS=${N_ITERS:-2000} EVAL_EVERY=${EVAL_EVERY:-1000} "$py" - "$file" <<'PY'
import os, sys
import yaml
spec = yaml.safe_load(open("ablations/ndr_table1.yaml"))
spec["name"] = "ndr_table1_short"
spec["models"] = os.environ["MODELS"].split(",")
if os.environ["VARIANTS"]:
    spec["tasks"] = [t for t in spec["tasks"] if t["variant"] in os.environ["VARIANTS"].split(",")]
spec["per_model"] = {m: v for m, v in spec.get("per_model", {}).items() if m in spec["models"]}
if os.environ["GPU_PER_TRIAL"]:
    spec["resources"] = {**spec["resources"], "gpu": float(os.environ["GPU_PER_TRIAL"])}
spec["budget"] = {**spec.get("budget", {}), "n_iters": int(os.environ["N_ITERS"]), "eval_every": int(os.environ["EVAL_EVERY"])}
yaml.safe_dump(spec, open(sys.argv[1], "w"), sort_keys=False)
PY

if command -v nvidia-smi > /dev/null; then
    nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv -l 2 > "$out/gpu.csv" &
    sampler=$!
fi
cli=("$py" -m orchestrator.cli)
start=$SECONDS
timeout "${LAUNCH_LIMIT_S:-480}" "${cli[@]}" launch ${LAUNCH_ARGS:-} "$file" 2>&1 | tee "$out/launch.txt"
echo "== launch: exit ${PIPESTATUS[0]} after $((SECONDS - start)) s" | tee -a "$out/launch.txt"
if [ -n "${sampler:-}" ]; then
    kill "$sampler"
    # The start and the compiles leave the GPU idle (0-5%): how busy the trials kept it is in the other samples.
    "$py" - "$out/gpu.csv" <<'PY' | tee -a "$out/launch.txt"
import csv, statistics, sys
busy = [float(row[1].strip().rstrip("%")) for row in list(csv.reader(open(sys.argv[1])))[1:] if len(row) > 1]
s = [u for u in busy if u > 10]
if s:
    print(f"== GPU busy (nvidia-smi every 2 s, the {len(s)} of {len(busy)} samples over 10%): mean {statistics.mean(s):.1f}%, "
          f"median {statistics.median(s):.0f}%, {sum(u >= 80 for u in s) / len(s):.0%} of them at 80% or more")
PY
fi
"${cli[@]}" status > "$out/status.txt" 2>&1
"${cli[@]}" report > "$out/report.txt" 2>&1
report=$(ls -t runs/*/report/report.html 2> /dev/null | head -1)
[ -n "$report" ] && cp "$report" "${report%.html}.md" "$out/"
"${cli[@]}" export --output "$out/runs.csv" > /dev/null 2>&1
if [ "${DRY_RUN_LIMIT_S:-0}" -gt 0 ]; then
    start=$SECONDS
    timeout "$DRY_RUN_LIMIT_S" "${cli[@]}" launch --dry-run ${LAUNCH_ARGS:-} ablations/ndr_table1.yaml > "$out/dry_run.txt" 2>&1
    echo "== dry run: exit $? after $((SECONDS - start)) s" >> "$out/dry_run.txt"
fi
ls -la "$out"
