"""Speed of the trainables on this machine.

  python benchmarks/bench_trainables.py [--quick] [--device cpu|cuda] [--bf16]

Prints, for every model at the NDR paper's CTL size (Table 7) and at a small size, training steps/s
and tokens/s on real CTL batches; the same for PANM and its seq2seq baselines on Copy and for the
compositional and multi-head Transformers on contextual retrieval (elements/s), at their presets'
size and a small size; the time of one NDR layer forward+backward divided by
torch.nn.TransformerEncoderLayer's at the same width, heads, length and batch (target: <= 2.0 on
CPU); and the time to generate ListOps' 1M-sample training set (uncached).
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import torch

from trainables.batches import batch_tensors
from trainables.config import keys_of, parse_trial_config, preset, presets
from trainables.devices import synchronize
from trainables.models.transformer import Layer, TransformerConfig
from trainables.steps import make_model
from trainables.tasks import listops, load_task

SMALL = {"d_model": 64, "n_layers": 4, "batch_size": 64}
# The other papers' models: (task, task options, model, small-size overrides); "paper" is the preset.
OTHER_MODELS = [
    (
        "copy",
        {"train_size": 5000, "online": False},
        "panm",
        {"d_model": 64, "hidden": 64, "mlp_hidden": 64, "batch_size": 64},
    ),
    ("copy", {"train_size": 5000, "online": False}, "lstm_seq2seq", {"d_model": 64, "batch_size": 64}),
    (
        "copy",
        {"train_size": 5000, "online": False},
        "transformer_seq2seq",
        {"d_model": 64, "n_heads": 4, "batch_size": 64},
    ),
    (
        "contextual_retrieval",
        {"train_size": 5000, "online": False},
        "transformer_compositional",
        {"d_model": 32, "batch_size": 64},
    ),
    (
        "contextual_retrieval",
        {"train_size": 5000, "online": False},
        "transformer",
        {"d_model": 32, "batch_size": 64},
    ),
]


# (d_model, heads, d_ff, length, batch): CTL's NDR (1 and 4 heads), a wide and a narrow long-sequence layer.
LAYER_SHAPES = [
    (256, 1, 512, 14, 512),
    (256, 4, 512, 14, 512),
    (512, 16, 1024, 52, 128),
    (128, 4, 256, 52, 128),
]


def model_rows() -> list[tuple[str, str, dict, str, dict]]:
    """(row label, task, task options, size, flat trial config) for every model at its paper's size
    (NDR Table 7 for CTL; the PANM and Compositional Attention presets) and at a small size."""
    ctl_options = {"train_size": 20_000}
    rows = []
    for name in presets("ctl")["models"]:
        paper = {**preset("ctl", name), "task_options": ctl_options}
        small = {**paper, **{k: v for k, v in SMALL.items() if k in keys_of(name)}}
        if "n_heads" in small:
            small["n_heads"] = min(small["n_heads"], 4)
        rows += [
            (f"ctl / {name}", "ctl", ctl_options, "paper", paper),
            (f"ctl / {name}", "ctl", ctl_options, "small", small),
        ]
    for task_name, options, name, small in OTHER_MODELS:
        paper = {**preset(task_name, name), "task_options": options}
        rows += [
            (f"{task_name} / {name}", task_name, options, "paper", paper),
            (f"{task_name} / {name}", task_name, options, "small", {**paper, **small}),
        ]
    return rows


def chosen_rows(rows: list[tuple], models: str | None, default: list[str] | None = None) -> list[tuple]:
    """The rows of `rows` whose label is among `models` (comma-separated, "ctl / ndr" or "ctl/ndr"),
    or of `default` where `models` is None (None: every row). A name no row has stops the run with
    one line and status 2: a benchmark that printed its header and nothing else looked like a result."""

    def label(name: str) -> str:
        return " / ".join(part.strip() for part in name.split("/"))

    wanted = [label(name) for name in models.split(",")] if models else default
    if wanted is None:
        return rows
    unknown = sorted(set(wanted) - {row[0] for row in rows})
    if unknown:
        print(
            f"--models: no row named {', '.join(map(repr, unknown))}; the rows: "
            f"{', '.join(sorted({row[0] for row in rows}))}",
            file=sys.stderr,
        )
        raise SystemExit(2)
    return [row for row in rows if row[0] in wanted]


def time_steps(model, task, batch_size: int, steps: int, device, bf16: bool) -> tuple[float, float]:
    """Training steps/s and input tokens/s (set elements/s for set tasks) on real batches."""
    split = task.splits["train"]
    rng = np.random.default_rng(0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batches = [
        batch_tensors(split, rng.integers(len(split), size=batch_size), device) for _ in range(steps + 2)
    ]

    def step(batch):
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            loss = task.kind.loss(task.kind.predict(model, batch), batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    for b in batches[:2]:  # warm-up
        step(b)
    synchronize(device)
    start = time.perf_counter()
    tokens = 0
    for b in batches[2:]:
        step(b)
        # Input tokens (Transformers add begin/end markers on top), or set elements.
        tokens += (
            int(b["lengths"].sum()) if "lengths" in b else b["features"].shape[0] * b["features"].shape[1]
        )
    synchronize(device)
    elapsed = time.perf_counter() - start
    return steps / elapsed, tokens / elapsed


def layer_ratio(
    d_model: int, n_heads: int, d_ff: int, length: int, batch: int, device, repeats: int
) -> tuple[float, float, float]:
    cfg = TransformerConfig(
        d_model=d_model, n_heads=n_heads, ff_multiplier=d_ff / d_model, dropout=0.0, query_dropout=0.0
    )
    ndr = Layer(cfg, "geometric", gated=True).to(device)
    ref = torch.nn.TransformerEncoderLayer(d_model, n_heads, d_ff, dropout=0.0, batch_first=True).to(device)
    x = torch.randn(batch, length, d_model, device=device, requires_grad=True)
    padding = torch.zeros(batch, length, dtype=torch.bool, device=device)

    def run(f):
        for _ in range(2):
            f().sum().backward()
        synchronize(device)
        start = time.perf_counter()
        for _ in range(repeats):
            f().sum().backward()
        synchronize(device)
        return (time.perf_counter() - start) / repeats

    t_ndr = run(lambda: ndr(x, padding)[0])
    t_ref = run(lambda: ref(x))
    return t_ndr, t_ref, t_ndr / t_ref


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="fewer steps, skip the 1M ListOps generation")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast (CUDA)")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    steps = 3 if args.quick else 10
    print(
        f"device {device}, torch {torch.__version__}, {torch.get_num_threads()} CPU threads, bf16 {args.bf16}"
    )

    rows = model_rows()

    tasks = {}
    print(
        f"\n{'task / model':48s} {'size':6s} {'params':>9s} {'batch':>6s} {'steps/s':>9s} {'tokens/s':>10s}"
    )
    for label, task_name, options, size, flat in rows:
        key = (task_name, repr(sorted(options.items())))
        task = tasks.setdefault(key, load_task(task_name, options))
        cfg = parse_trial_config(flat)
        torch.manual_seed(0)
        model = make_model(cfg, task).to(device)
        n_params = sum(p.numel() for p in model.parameters())
        sps, tps = time_steps(model, task, cfg.batch_size, steps, device, args.bf16 and device.type == "cuda")
        print(f"{label:48s} {size:6s} {n_params:9d} {cfg.batch_size:6d} {sps:9.2f} {tps:10.0f}", flush=True)

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
            d_model, heads, d_ff, length, batch, device, repeats=3 if args.quick else 10
        )
        print(
            f"{d_model:7d} {heads:5d} {d_ff:5d} {length:4d} {batch:5d} {t_ndr * 1e3:8.1f} "
            f"{t_ref * 1e3:9.1f} {ratio:6.2f}",
            flush=True,
        )

    if not args.quick:
        start = time.perf_counter()
        data = listops.build(listops.ListOpsConfig())
        elapsed = time.perf_counter() - start
        n = len(data.splits["train"])
        print(
            f"\nListOps generation: {n:,} training samples (+3 x 1,000 eval) in {elapsed:.1f} s "
            f"({n / elapsed:,.0f} samples/s, uncached)"
        )


if __name__ == "__main__":
    main()
