#!/usr/bin/env bash
# The GPU checks as one script, for a short loan of a GPU machine (minutes, not hours):
#
#   bash benchmarks/gpu_session.sh [OUT_DIR]
#
# Runs, each under its own time limit so that one failure or hang leaves the rest their time, and
# each printing into OUT_DIR (default ./gpu-out) as well as the terminal:
#   env.txt      the GPU, driver, torch
#   graphs.txt   the CUDA-graph equality tests (tests/test_graphs.py; their on_cuda tests run here only)
#   fused_ff.txt our Triton feed-forward kernels (fused_feed_forward): their tests on CUDA, the autotuner's
#                timing of their blocks, their time against PyTorch's eager and compiled sublayer, and NDR's
#                compiled bf16 stack of 20 with and without them
#   recompiles.txt  a search's compiled stacks one after another in one process: what each compiles, and its seconds
#   compiled.txt NDR stacked 20 high with compile: true (fused kernels; one CUDA graph since 2026-11-27), and its compile seconds
#   compiled_ro.txt the same compiled in mode reduce-overhead (torch's own CUDA graphs of the compiled step)
#   compiled_bf16.txt the same compiled (default mode) with bf16 autocast
#   compiled_graphs.txt  NDR and the Transformer stacked 5 and 20 high, compiled bf16 (the default for stacks on CUDA),
#                with the compiled step captured as one CUDA graph (the default since 2026-11-27) and without (--no-graphs)
#   compiled_mat.txt  the same compiled bf16 in mode max-autotune-no-cudagraphs (Triton matmuls with their
#                elementwise neighbours fused in: what the CPU's byte count says the step needs; on an
#                H200 it had not compiled after 420 s)
#   packing_stacks.txt  the Transformer, compiled bf16: one stack of 5, 10, 20 against 1, 2, 4 stacks of 5
#                side by side as separate processes (a Table 1 pair's seeds; resources.gpu 1/k)
#   packing_ndr.txt  the same packing for NDR (ablations/ndr_table1.yaml gives its stacks gpu 0.25 unmeasured)
#   curves_compiled.txt  NDR's learning curves compiled, TF32 against bf16: 5 seeds, 6,000 iterations
#   models.txt   bench_gpu models: NDR and Transformer at paper size, eager vs graphed vs back-to-back, kernels, GPU busy
#   curve.txt    bench_gpu curve: member-steps/s stacked 1, 5, 20, 50 high, NDR and Transformer
#   seeds.txt    bench_gpu seeds: 5 whole NDR trials (200 steps and an evaluation) one after another vs stacked
#   curve_fp32.txt, curve_bf16.txt, models_fp32.txt   the same with float32 matmuls (TF32 off) / bf16 autocast
#   profile.txt  where a stacked NDR step's GPU time goes, 1 and 20 members (benchmarks/profile_step.py)
#   others.txt   bench_gpu models for every other model at paper size
# On an H200 (2026-11-26) its parts but the compiled ones took about five minutes together; the
# compiled stacks may take up to five more each (on an H100, 1.5-2 each), compiled_mat and the
# packings up to seven to nine, the compiled curves up to nine: far more than one 15-minute lease.
# ONLY="graphs compiled" runs just the steps named (env always runs).
# The image's python3 is used as it is (torch without Ray or MLflow: the trainables need neither).
set -u
out=${1:-gpu-out}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD:$PWD/benchmarks${PYTHONPATH:+:$PYTHONPATH}"
py=${PYTHON:-python3}

run() {  # run LIMIT_S NAME COMMAND...: the command's output into $out/NAME.txt, its exit status after it
    local limit=$1 name=$2
    shift 2
    [[ -z "${ONLY:-}" || $name == env || " $ONLY " == *" $name "* ]] || return 0
    echo "== $name: $* (limit ${limit}s)" | tee "$out/$name.txt"
    local start=$SECONDS
    timeout "$limit" "$@" 2>&1 | tee -a "$out/$name.txt"
    echo "== $name: exit ${PIPESTATUS[0]} after $((SECONDS - start)) s" | tee -a "$out/$name.txt"
}

run 30 env bash -c "nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv; \
    $py -c 'import torch; print(\"torch\", torch.__version__, \"cuda\", torch.version.cuda, torch.cuda.get_device_name())'"
run 240 graphs "$py" -m pytest -q -p no:cacheprovider -x tests/test_graphs.py -k "cuda or graphed"
# fused_feed_forward (written without a GPU). On an H200 (2026-11-27) its
# kernels computed PyTorch's sublayer but made NDR's compiled bf16 stack of 20 slower (257.8
# member-steps/s against 441.2), with fixed blocks; they are autotuned since. First whether they
# are right, then the stack with and without them (the answer that decides), then how the
# autotuner timed each block and the op alone against PyTorch's (their kernels compiled by then).
run 520 fused_ff bash -c "$py -m pytest -q -p no:cacheprovider tests/test_feed_forward_op.py -k cuda \
    && for fused in true false; do $py benchmarks/bench_gpu.py --device cuda --sections curve --sizes paper \
    --models 'ctl / ndr' --steps 20 --seeds-n 20 --compile --bf16 --set fused_feed_forward=\$fused; done; \
    $py benchmarks/ff_kernel.py --members 1,20 --sweep; $py benchmarks/ff_kernel.py --members 1,20"
# A search's trials in one process, as Tune's reused actor runs them: stacks of 5 paper NDRs, two of
# other dropout rates (since 2026-11-28 the second compiles nothing: rates live in tensors), then one
# of another depth (compiles again, and under torch's recompile limit). Each compile's seconds on a GPU.
run 540 recompiles "$py" benchmarks/bench_recompiles.py --device cuda --size paper --members 5 --steps 10 \
    --trials "dropout=0.1; dropout=0.3; n_layers=10 dropout=0.2"
# Compiled stacks (fused kernels; the default for stacks on CUDA: compile auto).
run 300 compiled "$py" benchmarks/bench_gpu.py --device cuda --sections curve --sizes paper --models "ctl / ndr" \
    --steps 20 --seeds-n 20 --compile
run 300 compiled_ro "$py" benchmarks/bench_gpu.py --device cuda --sections curve --sizes paper --models "ctl / ndr" \
    --steps 20 --seeds-n 20 --compile reduce-overhead
# What the CUDA graph adds to a compiled stack: a launch's compiled stack of 5 NDRs, launched kernel
# by kernel, kept an H200 40% busy (2026-11-27); a Table 1 pair stacks 5. The second run's compiles
# come from the first's cache.
run 560 compiled_graphs bash -c "for graphs in '' --no-graphs; do $py benchmarks/bench_gpu.py --device cuda --sections curve \
    --sizes paper --models 'ctl / ndr,ctl / transformer' --steps 20 --seeds-n 5,20 --compile --bf16 \$graphs; done"
# bf16 autocast halves what the activations move, which fusion alone cannot, and its casts fuse
# only when compiled (benchmarks/ops_per_step.py; docs/performance.md#what-a-step-costs-flops-and-bytes).
run 300 compiled_bf16 "$py" benchmarks/bench_gpu.py --device cuda --sections curve --sizes paper --models "ctl / ndr" \
    --steps 20 --seeds-n 20 --compile --bf16
# Inductor fuses elementwise work into the matrix products' Triton templates only in max-autotune
# modes; the byte count on the CPU cannot show it (its autotuner keeps aten's matmuls). On an H200
# (2026-11-27) it had autotuned 16 batched products and not finished compiling after 420 s, and
# Inductor reported layout conflicts for 9 of the products' outputs (their templates wanted another
# stride): run alone, it shows whether it compiles at all and what it then gains.
run 560 compiled_mat "$py" benchmarks/bench_gpu.py --device cuda --sections curve --sizes paper --models "ctl / ndr" \
    --steps 20 --seeds-n 20 --compile max-autotune-no-cudagraphs --bf16
# Whether a pair's 5 stacked seeds should share a GPU with other pairs' (resources.gpu 0.5, 0.25) or
# hold it alone: a lone stack of 5 leaves the GPU idle part of the step
# (docs/performance.md#gpu-stacks-sharing-a-gpu).
run 420 packing_stacks "$py" benchmarks/bench_gpu.py --device cuda --sections curve,packing --sizes paper \
    --models "ctl / transformer" --steps 20 --seeds-n 5,10,20 --packed 1,2,4 --pack-members 5 --compile --bf16
# Each process compiles its own NDR stack (1.5-3 min on an H100; the compile cache shortens the later ones).
run 560 packing_ndr "$py" benchmarks/bench_gpu.py --device cuda --sections packing --sizes paper \
    --models "ctl / ndr" --steps 20 --seeds-n 5 --packed 1,2,4 --pack-members 5 --compile --bf16
# The fastest stack so far (H100, 2026-11-26: 2.03x the graphed one) is compiled bf16; it learns
# as TF32 does at the paper's setting (within seed noise at 6 of 6 evaluations:
# docs/performance.md#gpu-precision-and-learning-curves), so
# stacks on CUDA compile in bf16 by default (compile: auto, bf16: auto). Rerun it after a torch upgrade.
run 560 curves_compiled "$py" benchmarks/precision_curves.py --preset ctl/ndr --seeds 0,1,2,3,4 --precisions tf32,bf16 \
    --n-iters 6000 --eval-every 1000 --parallel --set compile=true --csv "$out/curves_compiled.csv"
run 150 models "$py" benchmarks/bench_gpu.py --device cuda --sections models --sizes paper \
    --models "ctl / ndr,ctl / transformer" --steps 50
run 120 curve "$py" benchmarks/bench_gpu.py --device cuda --sections curve --sizes paper \
    --models "ctl / ndr,ctl / transformer" --steps 20 --seeds-n 1,5,20,50
run 100 seeds "$py" benchmarks/bench_gpu.py --device cuda --sections seeds --sizes paper --models "ctl / ndr" \
    --steps 200 --seeds-n 5 --repeats 1
for precision in fp32 bf16; do
    run 75 "curve_$precision" "$py" benchmarks/bench_gpu.py --device cuda --sections curve --sizes paper \
        --models "ctl / ndr,ctl / transformer" --steps 20 --seeds-n 1,5,20,50 "--$precision"
done
run 70 models_fp32 "$py" benchmarks/bench_gpu.py --device cuda --sections models --sizes paper \
    --models "ctl / ndr,ctl / transformer" --steps 50 --fp32
run 60 profile "$py" benchmarks/profile_step.py --preset ctl/ndr --members 1,20 --steps 10 --rows 30 \
    --set 'task_options={train_size: 20000}'
run 120 others "$py" benchmarks/bench_gpu.py --device cuda --sections models --sizes paper --steps 20 \
    --models "ctl / lstm,ctl / transformer_rel_gate,ctl / transformer_geometric,copy / panm,contextual_retrieval / transformer_compositional"
