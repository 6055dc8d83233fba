#!/usr/bin/env bash
# gpu-baseline/ held the trainables package of the commit before the column sum (git archive 31d5d7c trainables), the A/B's "old".
# Run with the code of that session (TF32 then off by default, hence --tf32; the flag is now gone and TF32 the default).
# This session's lease, call 1: CUDA graph tests, A/B of the geometric scan, then NDR precision curves in the background.
set -u
export PYTHONUNBUFFERED=1
keep=$PWD/gpu-out/s5; mkdir -p "$keep"
t0=$SECONDS
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; python3 -c 'import torch; print("torch", torch.__version__)'; } > "$keep/env.txt" 2>&1
PYTHONPATH=$PWD:$PWD/benchmarks timeout 60 python3 -m pytest -q -p no:cacheprovider tests/test_graphs.py tests/test_formulas.py -k "cuda or graphed or geometric" > "$keep/graphs.txt" 2>&1
echo "graphs exit $? at $((SECONDS - t0)) s" | tee -a "$keep/graphs.txt"; tail -2 "$keep/graphs.txt"
for args in "--members 20 --tf32" "--members 5"; do
  for v in old new old new; do
    if [ $v = old ]; then pp=$PWD/gpu-baseline; else pp=$PWD; fi
    echo "== $v $args" >> "$keep/ab.txt"
    PYTHONPATH=$pp:$PWD/benchmarks timeout 60 python3 benchmarks/profile_step.py --preset ctl/ndr $args --steps 10 --rows 6 \
      --set 'task_options={train_size: 20000}' >> "$keep/ab.txt" 2>&1
  done
done
grep -E "^== |member-steps" "$keep/ab.txt"; echo "ab done at $((SECONDS - t0)) s"
cd benchmarks
PYTHONPATH=$OLDPWD setsid nohup python3 precision_curves.py --preset ctl/ndr --seeds 0,1,2,3,4 --precisions fp32,tf32 \
  --n-iters 6000 --eval-every 1000 --parallel --csv "$keep/curves.csv" > "$keep/curves.txt" 2>&1 < /dev/null &
cd ..
while [ $((SECONDS - t0)) -lt 570 ] && ! grep -q "within seed noise" "$keep/curves.txt"; do
  sleep 15; cp -r "$keep" "$OUT/"
done
tail -4 "$keep/curves.txt"; cp -r "$keep" "$OUT/"
