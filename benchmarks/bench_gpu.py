"""Throughput of small-model trials on one device: what packing trials and batching seeds buy.

  python benchmarks/bench_gpu.py [--device cuda|cpu] [--sizes paper,small]
                                 [--sections models,curve,packing,seeds,layer]
                                 [--bf16] [--fp32] [--compile [MODE]] [--steps N] [--repeats R] [--quick]

Runs on a GPU or, slower and with other conclusions, on the CPU. Sections:

  models   training steps/s of every model through the training loop's own step
           (trainables.timing.training_step: device-resident splits, no host sync), each step waited
           for: eager and, on CUDA, each step one CUDA graph replay (cuda_graphs: auto; with
           --compile also torch.compile and its compile seconds); the faster of eager and graphed
           back to back, as a trial queues its steps, with its kernels per step and the fraction of
           the time the GPU is busy (torch.profiler); the share of a trial's time its evaluations
           take (they run eagerly); and peak memory
  curve    member-steps/s of one configuration stacked N members high (--seeds-n, e.g.
           1,5,20,50), and the stack size a launch with budget.stack_size auto would take; the
           seconds the row took in all (with --compile: the compiles, one per batch width at first)
  packing  one trial packed 1, 2, 4 and 8 times (--packed) on the device as separate processes
           started together (as Ray runs trials with `resources.gpu: 1/k`): steps/s of each and
           member-steps/s of all; with --pack-members N each process trains a stack of N seeds
           (what a Table 1 pair's 5 seeds are), to set against one stack of k x N (the curve section)
  seeds    N seeds of one configuration batched (trainables.batched) vs the same N seeds trained one
           after another: whole training runs (data loading and one evaluation included),
           alternated side by side, medians over --repeats; and the same stack with a learning
           rate and weight decay of each member's own (what a grid over lr x weight_decay stacks)
  layer    one NDR layer vs torch.nn.TransformerEncoderLayer, forward+backward (bench_trainables)

On the CPU, processes and a stacked model share the same cores, so neither packing nor batching can
beat one trial by much; the figures that matter for a GPU need a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch
from bench_trainables import LAYER_SHAPES, chosen_rows, layer_ratio, model_rows
from profile_step import WARMUP_STEPS

from orchestrator.run.stacking import knee
from trainables.batched import Stack, member_steps_per_second, train_members, train_seeds
from trainables.config import COMPILE_MODES, parse_trial_config, set_override
from trainables.devices import pick_device, setup_device, synchronize
from trainables.evaluation import Selection
from trainables.graphs import graphs_unused_because
from trainables.models import batchable
from trainables.steps import make_model
from trainables.tasks import load_task
from trainables.timing import seconds_per_step, training_step
from trainables.train import train


def trial_config(flat: dict, args, **more) -> dict:
    out = {
        **flat,
        "device": args.device,
        "bf16": args.bf16,
        "tf32": not args.fp32,
        "compile": args.compile,
        **({"cuda_graphs": False} if args.no_graphs else {}),
        **more,
    }
    for assignment in args.set:
        set_override(out, assignment)
    return out


def peak_mib(device: torch.device) -> float | None:
    return torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None


def shown(mib: float | None) -> str:
    return "-" if mib is None else f"{mib:,.0f}"


def back_to_back(cfg, steps: int) -> tuple[float, float | None, float | None]:
    """(steps/s, CUDA kernels per step, the fraction of the wall time the GPU ran kernels) of `steps`
    steps queued one after another with one wait at the end, as a trial trains (it reads the device
    once per evaluation, so the host prepares a step while the device runs the one before), after
    profile_step's warm-up, by which a trial has usually captured a graph for each length bucket
    (batches are drawn at random): a capture inside the window would count as the GPU idling.
    The rate without the profiler; kernels and busy (CUDA only) from torch.profiler over as many
    steps again."""
    step, device = training_step(cfg)

    def queued(n: int) -> float:
        start = time.perf_counter()
        for _ in range(n):
            step()
        synchronize(device)
        return time.perf_counter() - start

    queued(WARMUP_STEPS)
    rate = steps / queued(steps)
    if device.type != "cuda":
        return rate, None, None
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    ) as prof:
        wall = queued(steps)
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    busy_us = sum(getattr(e, "device_time", None) or e.cuda_time for e in kernels)
    return rate, len(kernels) / steps, busy_us / 1e6 / wall


def evaluation_seconds(cfg) -> float:
    """Seconds of one evaluation of `cfg`'s untrained model as a trial makes it on a new best (both
    validation splits and every test split, trainables.evaluation.Selection), after one warm-up."""
    device = pick_device(cfg.device)
    task = load_task(cfg.task, cfg.task_options)
    model = make_model(cfg, task).to(device)
    times = []
    for _ in range(2):
        start = time.perf_counter()
        Selection(cfg, task, device, None, "bench")(model, 1, 1.0, {}, 1.0)
        synchronize(device)
        times.append(time.perf_counter() - start)
    return times[-1]


def models(args, rows) -> None:
    print(
        f"\nTraining steps/s through trainables.train's step, median of {args.steps} steps each waited for, "
        "after one warm-up (graphed: cuda_graphs auto, '-' where the step stays eager; compiled: with "
        "--compile, its first step's seconds beside it); back-to-back: the faster of eager and graphed, "
        f"{args.steps} steps queued as a trial queues them, with their kernels per step and GPU busy "
        "(bench_gpu.back_to_back); eval share: one evaluation of every split, eager, over itself and "
        "eval_every steps at the fastest rate"
    )
    print(
        f"{'task / model':48s} {'size':6s} {'batch':>6s} {'eager':>9s} {'graphed':>9s} {'compiled':>9s} "
        f"{'compile s':>9s} {'back-to-back':>12s} {'kernels':>8s} {'GPU busy':>8s} "
        f"{'eval share':>10s} {'peak MiB':>9s}"
    )
    for label, _, _, size, flat in rows:
        cfg = parse_trial_config(trial_config(flat, args, cuda_graphs=False, compile=False))
        device = pick_device(cfg.device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        eager = 1 / seconds_per_step(cfg, args.steps)
        best = cfg
        graphed = compiled = compile_s = None
        auto = parse_trial_config(trial_config(flat, args, cuda_graphs="auto", compile=False))
        if graphs_unused_because(auto, device) is None:
            graphed = 1 / seconds_per_step(auto, args.steps)
            best = auto if graphed > eager else cfg
        if args.compile:
            start = time.perf_counter()
            compiled = 1 / seconds_per_step(
                parse_trial_config(trial_config(flat, args, cuda_graphs=False, compile=args.compile)),
                args.steps,
            )
            compile_s = time.perf_counter() - start - args.steps / compiled
        rate, kernels, busy = back_to_back(
            best, args.steps
        )  # not compiled: that would compile again, for minutes
        evaluation = evaluation_seconds(cfg)
        eval_share = evaluation / (
            evaluation + cfg.eval_every / max(r for r in (eager, graphed, compiled, rate) if r)
        )

        def cell(value, spec):
            return f"{'-':>{spec.split('.')[0]}s}" if value is None else format(value, spec)

        print(
            f"{label:48s} {size:6s} {cfg.batch_size:6d} {eager:9.2f} {cell(graphed, '9.2f')} "
            f"{cell(compiled, '9.2f')} {cell(compile_s, '9.0f')} {rate:12.2f} {cell(kernels, '8.0f')} "
            f"{cell(busy, '8.2f')} {eval_share:10.3f} {shown(peak_mib(device)):>9s}",
            flush=True,
        )


def curve(args, rows) -> None:
    print(
        "\nMember-steps/s of one configuration stacked N members high "
        f"(trainables.batched.member_steps_per_second, median of {args.steps} steps), and its knee (the "
        "stack size budget.stack_size auto takes)"
    )
    print(
        f"{'task / model':32s} {'size':6s} "
        + " ".join(f"{f'N={n}':>9s}" for n in args.seeds_n)
        + f" {'knee':>5s} {'s in all':>8s}"
    )
    for label, _, _, size, flat in rows:
        cfg = parse_trial_config(trial_config(flat, args))
        if batchable(trial_config(flat, args)):
            continue
        start = time.perf_counter()
        measured = member_steps_per_second(cfg, args.seeds_n, args.steps)
        rates = dict(measured)
        print(
            f"{label:32s} {size:6s} "
            + " ".join(f"{rates[n]:9.1f}" if n in rates else f"{'no mem':>9s}" for n in args.seeds_n)
            + f" {knee(measured):5d} {time.perf_counter() - start:8.0f}",
            flush=True,
        )


def child(config_json: str, steps: int, members: int) -> None:
    """One packed trial (a stack of `members` seeds where more than one): build, warm up (a compile
    included), say ready, wait for the parent's go (so that every process times the same moments),
    time `steps` steps, print the seconds and the peak memory."""
    cfg = parse_trial_config(json.loads(config_json))

    def barrier() -> None:
        print("ready", flush=True)
        sys.stdin.readline()

    if members == 1:
        seconds = seconds_per_step(cfg, steps, before_timing=barrier) * steps
    else:
        device = setup_device(cfg)  # its share of the CPU threads, as a trial's (Ray sets them to its CPUs)
        stack = Stack(
            cfg,
            [{"seed": seed} for seed in range(members)],
            load_task(cfg.task, cfg.task_options),
            device,
            log=None,
        )
        for _ in range(2):  # the first compiles (where compiled), the second replays what the timing will
            stack.step()
        synchronize(device)
        barrier()
        start = time.perf_counter()
        for _ in range(steps):
            stack.step()
        synchronize(device)
        seconds = time.perf_counter() - start
    print(json.dumps({"seconds": seconds, "peak_mib": peak_mib(pick_device(cfg.device))}), flush=True)


def packed_rates(flat: dict, k: int, members: int, args) -> tuple[list[float], float, float | None]:
    """k copies of one trial (a stack of `members`) run at once, each in its own process with its
    share of the CPU threads (Ray sets a trial's threads to its CPUs): each one's steps/s, all
    member-steps over the wall time from the go to the last one's end (a copy that ends early
    leaves the others more), and the largest peak memory."""
    threads = max(1, (os.cpu_count() or 1) // k)
    config = json.dumps(trial_config(flat, args, threads=threads))
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--child",
                config,
                "--steps",
                str(args.steps),
                "--pack-members",
                str(members),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(k)
    ]
    for p in procs:
        if p.stdout.readline().strip() != "ready":
            raise RuntimeError(f"a packed trial failed before its timing (exit {p.wait()})")
    start = time.perf_counter()
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    results = [json.loads(p.stdout.readline()) for p in procs]
    wall = time.perf_counter() - start
    for p in procs:
        p.wait()
    peak = max((r["peak_mib"] for r in results), default=None, key=lambda mib: mib or 0)
    return [args.steps / r["seconds"] for r in results], k * members * args.steps / wall, peak


def packing(args, rows) -> None:
    print(
        f"\nTrials packed on one {args.device} device as separate processes, {args.steps} steps each, "
        "started together (members: each trial's stack of seeds)"
    )
    print(
        f"{'task / model':32s} {'size':6s} {'members':>7s} {'trials':>6s} {'steps/s each':>13s} "
        f"{'member-steps/s all':>19s} {'vs 1 trial':>10s} {'peak MiB each':>14s}"
    )
    for label, _, _, size, flat in rows:
        for members in args.pack_members:
            alone = None
            for k in args.packed:
                rates, total, peak = packed_rates(flat, k, members, args)
                alone = alone or total
                print(
                    f"{label:32s} {size:6s} {members:7d} {k:6d} {statistics.median(rates):13.2f} "
                    f"{total:19.2f} {total / alone:10.2f} {shown(peak):>14s}",
                    flush=True,
                )


def seeds(args, rows) -> None:
    print(
        "\nN seeds batched in one stacked model vs the same N seeds one after another: whole runs of "
        f"{args.steps} steps and one evaluation, alternated, median of {args.repeats}"
    )
    print(
        f"{'task / model':32s} {'size':6s} {'N':>3s} {'separate s':>11s} {'batched s':>10s} "
        f"{'batched/separate':>17s} {'loop seed-steps/s sep.':>23s} {'batched':>8s} "
        f"{'own lr s':>9s} {'own lr/batched':>15s}"
    )
    for label, _, _, size, flat in rows:
        base = trial_config(flat, args, n_iters=args.steps, eval_every=args.steps)
        if batchable(base):
            continue
        load_task(
            base["task"], base.get("task_options", {})
        )  # generate into the cache once, outside the timing
        for n in args.seeds_n:
            seed_list = list(range(n))
            separate, batched, rate_separate, rate_batched, own = [], [], [], [], []
            # Members with a learning rate and decay each: the optimizer's step is scaled per member.
            lr = parse_trial_config(base).lr
            members = [
                {"seed": seed, "lr": lr * 2 ** (k % 3), "weight_decay": 0.01 * (k % 2)}
                for k, seed in enumerate(seed_list)
            ]
            for _ in range(args.repeats):
                start = time.perf_counter()
                runs = [train(parse_trial_config({**base, "seed": seed}), log=None) for seed in seed_list]
                separate.append(time.perf_counter() - start)
                # Seed-steps per second of training loop, evaluations left out: n runs back to back.
                rate_separate.append(n / sum(1 / r["steps_per_s"] for r in runs))
                start = time.perf_counter()
                together = train_seeds(parse_trial_config(base), seed_list, log=None)
                batched.append(time.perf_counter() - start)
                rate_batched.append(n * together[0]["steps_per_s"])
                start = time.perf_counter()
                train_members(parse_trial_config(base), members, log=None)
                own.append(time.perf_counter() - start)
            sep, bat, mine = statistics.median(separate), statistics.median(batched), statistics.median(own)
            print(
                f"{label:32s} {size:6s} {n:3d} {sep:11.1f} {bat:10.1f} {bat / sep:17.2f} "
                f"{statistics.median(rate_separate):23.2f} {statistics.median(rate_batched):8.2f} "
                f"{mine:9.1f} {mine / bat:15.2f}",
                flush=True,
            )


def layer(args) -> None:
    device = torch.device(args.device)
    print(
        "\nOne NDR layer (geometric attention + copy gate) forward+backward vs "
        "torch.nn.TransformerEncoderLayer"
    )
    print(
        f"{'d_model':>7s} {'heads':>5s} {'d_ff':>5s} {'len':>4s} {'batch':>5s} {'NDR ms':>8s} "
        f"{'torch ms':>9s} {'ratio':>6s}"
    )
    for d_model, heads, d_ff, length, batch in LAYER_SHAPES:
        t_ndr, t_ref, ratio = layer_ratio(
            d_model, heads, d_ff, length, batch, device, repeats=max(3, args.steps)
        )
        print(
            f"{d_model:7d} {heads:5d} {d_ff:5d} {length:4d} {batch:5d} {t_ndr * 1e3:8.1f} "
            f"{t_ref * 1e3:9.1f} {ratio:6.2f}",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--sizes", default="paper,small", help="paper, small or both, comma-separated")
    parser.add_argument("--sections", default="models,curve,packing,seeds,layer")
    parser.add_argument(
        "--models",
        default=None,
        help="comma-separated row labels to keep, e.g. 'ctl / ndr' (default: "
        "every model; on a CPU, ctl / ndr alone for packing and seeds)",
    )
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast")
    parser.add_argument("--fp32", action="store_true", help="float32 matmuls on CUDA (the default is TF32)")
    parser.add_argument(
        "--compile",
        nargs="?",
        const=True,
        default=False,
        choices=COMPILE_MODES,
        help="torch.compile (in torch's default mode, or MODE: e.g. reduce-overhead, its own CUDA graphs): "
        "the models section's compiled column; the curve section's stacks compiled (captured as one CUDA "
        "graph unless --no-graphs or the mode graphs them itself)",
    )
    parser.add_argument(
        "--no-graphs",
        action="store_true",
        help="cuda_graphs: false (a stack's compiled kernels launched one by one)",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="over every row's config, e.g. fused_feed_forward=true (a key the row's model lacks is refused)",
    )
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seeds-n", default="5", help="seed counts to batch, comma-separated")
    parser.add_argument("--quick", action="store_true", help="3 steps, 1 repeat")
    parser.add_argument(
        "--packed", default="1,2,4,8", help="packing: how many trials at once, comma-separated"
    )
    parser.add_argument(
        "--pack-members",
        default="1",
        help="packing: each trial's stack of seeds, comma-separated (1: a plain trial)",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.child, args.steps, int(args.pack_members))
    args.packed = [int(k) for k in args.packed.split(",")]
    args.pack_members = [int(n) for n in args.pack_members.split(",")]
    if args.quick:
        args.steps, args.repeats = 3, 1
    args.seeds_n = [int(n) for n in args.seeds_n.split(",")]
    sizes, sections = args.sizes.split(","), args.sections.split(",")
    rows = [row for row in model_rows() if row[3] in sizes]

    def chosen(default: list[str] | None):
        return chosen_rows(rows, args.models, default)

    chosen(None)  # a name no row has stops the run here, before its header

    print(
        f"device {args.device}{f' ({torch.cuda.get_device_name()})' if args.device == 'cuda' else ''}, torch "
        f"{torch.__version__}, {os.cpu_count()} CPUs, bf16 {args.bf16}, tf32 {not args.fp32}, compile "
        f"{args.compile}, cuda_graphs {'false' if args.no_graphs else 'auto'}"
        + "".join(f", {assignment}" for assignment in args.set)
    )
    if "models" in sections:
        models(args, chosen(None))
    # Every model on a GPU; on a CPU (minutes per paper-size row) the NDR alone unless --models says.
    heavy_default = None if args.device == "cuda" else ["ctl / ndr"]
    if "curve" in sections:
        curve(args, chosen(heavy_default))
    if "packing" in sections:
        packing(args, chosen(heavy_default))
    if "seeds" in sections:
        seeds(args, chosen(heavy_default))
    if "layer" in sections:
        layer(args)


if __name__ == "__main__":
    main()
