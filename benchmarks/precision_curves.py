"""Learning curves in float32, TF32 and bf16 autocast, over seeds: whether fast matmuls are safe.

  python benchmarks/precision_curves.py [--preset ctl/ndr] [--set key=value ...] [--seeds 0,1,2,3,4]
                                        [--precisions fp32,tf32,bf16] [--n-iters N] [--eval-every E]
                                        [--csv out.csv] [--parallel]

TF32 and bf16 are the CUDA defaults (bf16 for compiled stacks) because their curves at the papers'
settings stay within seed noise of float32's. Each precision trains the same seeds (stacked, as a
launch would: trainables.batched), and at every evaluation the script prints each precision's mean
± std over seeds of the OOD and IID validation scores, and whether its mean lies within two of
float32's standard errors of the difference (seed noise). TF32 changes nothing on a CPU: run it on
the GPU a launch will use (docs/performance.md#gpu-precision-and-learning-curves has the commands
and figures).
"""

from __future__ import annotations

import argparse
import csv
import statistics
import subprocess
import sys
import tempfile
import time

from trainables.batched import train_members
from trainables.config import parse_trial_config, preset, set_override
from trainables.scores import LOWER_IS_BETTER

PRECISIONS = {
    "fp32": {"tf32": False, "bf16": False},
    "tf32": {"tf32": True, "bf16": False},
    "bf16": {"bf16": True, "tf32": False},
}


def score_of(metrics: dict) -> str:
    """The task's score (acc, token_acc, l1, ...): the one its OOD validation reports."""
    return next(k[len("ood_valid_") :] for k in metrics if k.startswith("ood_valid_"))


def curves(flat: dict, seeds: list[int], precision: str) -> dict[int, list[dict]]:
    """Iteration -> each seed's metrics at that evaluation."""
    cfg = parse_trial_config(
        {"compile": False, **flat, **PRECISIONS[precision]}
    )  # uncompiled unless --set compile=...
    out: dict[int, list[dict]] = {}
    start = time.perf_counter()

    def report(per_member, state) -> None:
        iteration = per_member[0]["iteration"]
        out[iteration] = [dict(m) for m in per_member]
        key = f"ood_valid_{score_of(per_member[0])}"
        print(
            f"[{precision}] iteration {iteration:,} after {time.perf_counter() - start:.0f} s: {key} "
            + " ".join(f"{m[key]:.3f}" for m in per_member),
            file=sys.stderr,
            flush=True,
        )

    print(
        f"[{precision}] training {len(seeds)} seeds stacked, {cfg.n_iters:,} iterations",
        file=sys.stderr,
        flush=True,
    )
    train_members(cfg, [{"seed": seed} for seed in seeds], report=report, log=None)
    return out


def in_parallel(precisions: list[str]) -> dict[str, dict[int, list[dict]]]:
    """Each precision's curves from a process of its own, started together with this script's
    arguments, read back from the CSV each writes."""
    with tempfile.TemporaryDirectory() as folder:
        others = [a for a in sys.argv[1:] if a != "--parallel"]
        children = []
        for p in precisions:
            argv = [sys.executable, __file__, *others, "--precisions", p, "--csv", f"{folder}/{p}.csv"]
            children.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL))  # its progress on stderr
        if any(child.wait() for child in children):
            sys.exit(f"a precision's process failed: exit {[child.returncode for child in children]}")
        return {p: read_curves(f"{folder}/{p}.csv") for p in precisions}


def read_curves(path: str) -> dict[int, list[dict]]:
    """Iteration -> each seed's metrics, as `curves` returns them, from the CSV this script writes."""
    out: dict[int, list[dict]] = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            out.setdefault(int(row.pop("iteration")), []).append(
                {k: float(v) for k, v in row.items() if k not in ("precision", "seed")}
            )
    return out


def within_noise(values: list[float], reference: list[float]) -> bool:
    """The means differ by at most two standard errors of their difference (seed noise)."""
    spread = (
        statistics.variance(values) / len(values) + statistics.variance(reference) / len(reference)
    ) ** 0.5
    return abs(statistics.fmean(values) - statistics.fmean(reference)) <= 2 * spread + 1e-9


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--preset", default="ctl/ndr", help="task/model: the paper's setting (trainables.config.preset)"
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a key (repeatable; YAML values)",
    )
    parser.add_argument("--seeds", default="0,1,2,3,4")
    parser.add_argument("--precisions", default="fp32,tf32,bf16")
    parser.add_argument("--n-iters", type=int, default=None, help="default: the preset's")
    parser.add_argument("--eval-every", type=int, default=None)
    parser.add_argument("--csv", help="also write every evaluation of every seed here")
    parser.add_argument(
        "--parallel",
        action="store_true",
        help="train the precisions at once, a process each, on the "
        "same device: a stack of a few members leaves a GPU idle part of each step (NDR's fp32 and TF32 "
        "curves fit 15 minutes of one GPU this way, not one after the other)",
    )
    args = parser.parse_args()
    task, model = args.preset.split("/")
    flat = preset(task, model)
    for assignment in args.set:
        set_override(flat, assignment)
    flat.update({k: v for k, v in (("n_iters", args.n_iters), ("eval_every", args.eval_every)) if v})
    seeds, precisions = [int(s) for s in args.seeds.split(",")], args.precisions.split(",")
    if args.parallel and len(precisions) > 1:
        runs = in_parallel(precisions)
    else:
        runs = {p: curves(flat, seeds, p) for p in precisions}
    metric = score_of(next(iter(runs[precisions[0]].values()))[0])
    print(
        f"{args.preset}, seeds {seeds}: ood_valid_{metric} / iid_valid_{metric}, mean ± std over seeds"
        f" ({'lower' if metric in LOWER_IS_BETTER else 'higher'} is better); '~' within "
        "seed noise of fp32, '!' not"
    )
    print(f"{'iteration':>9s} " + " ".join(f"{p:>27s}" for p in precisions))
    verdicts = {p: [] for p in precisions}
    for iteration in sorted(runs[precisions[0]]):
        cells = []
        for p in precisions:
            ood = [m[f"ood_valid_{metric}"] for m in runs[p][iteration]]
            iid = [m[f"iid_valid_{metric}"] for m in runs[p][iteration]]
            reference = [m[f"ood_valid_{metric}"] for m in runs[precisions[0]][iteration]]
            same = len(seeds) < 2 or within_noise(ood, reference)
            verdicts[p].append(same)
            spread = statistics.stdev(ood) if len(ood) > 1 else 0.0
            cells.append(
                f"{statistics.fmean(ood):.3f}±{spread:.3f} / "
                f"{statistics.fmean(iid):.3f} {'~' if same else '!'}"
            )
        print(f"{iteration:9d} " + " ".join(f"{c:>27s}" for c in cells))
    for p in precisions[1:]:
        print(
            f"{p}: within seed noise of {precisions[0]} at {sum(verdicts[p])} of "
            f"{len(verdicts[p])} evaluations"
        )
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(
                ["precision", "seed", "iteration", f"ood_valid_{metric}", f"iid_valid_{metric}", "loss"]
            )
            for p in precisions:
                for iteration, members in sorted(runs[p].items()):
                    for seed, m in zip(seeds, members):
                        writer.writerow(
                            [
                                p,
                                seed,
                                iteration,
                                m[f"ood_valid_{metric}"],
                                m[f"iid_valid_{metric}"],
                                m["loss"],
                            ]
                        )


if __name__ == "__main__":
    main()
