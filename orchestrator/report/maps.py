"""What a researcher opens first: the attention and gate maps of a pair's best trial (the NDR
paper's Figure 2: per layer, where each position attends and how much of it the copy gate
updates) and PANM's pointer attention per decoding step. The trial's last checkpoint is loaded into
its model and run on the longest example of its longest test split (Sort-of-CLEVR: a ternary
question about the first test image, the columns its summary token and patches)."""

from __future__ import annotations

import inspect
import io
import json
from pathlib import Path

import numpy as np

from trainables.config import parse_trial_config
from trainables.tasks import load_task

from ..record.runs import CONFIG_TAG
from .plots import figure_png, pyplot

MAX_LAYER_PANELS = 14


def last_model_state(state, run) -> dict | None:
    """The model weights of the run's newest checkpoint in the trial storage, or None."""
    import pyarrow.fs  # noqa: PLC0415 - Ray's and MLflow's, seconds to import: maps alone read checkpoints

    fs, root = state.trial_storage().filesystem()
    fs = fs or pyarrow.fs.LocalFileSystem()
    phase = "confirm" if run.data.tags.get("phase") == "confirm" else "tune"
    trial_dir = f"{root}/{state.launch_id}/{phase}/{run.data.tags['pair']}_{run.data.tags['trial_id']}"
    found = fs.get_file_info(pyarrow.fs.FileSelector(trial_dir, allow_not_found=True))
    checkpoints = sorted(info.path for info in found if info.base_name.startswith("checkpoint_"))
    if not checkpoints:
        return None
    # torch takes seconds to import: a report imports it only where there is a checkpoint to draw.
    import torch  # noqa: PLC0415

    from trainables.batched import member_state_dict  # noqa: PLC0415 - as torch

    with fs.open_input_stream(f"{checkpoints[-1]}/state.pt") as f:
        saved = torch.load(io.BytesIO(f.read()), weights_only=False, map_location="cpu")
    # A trial of stacked members holds every member's weights, stacked: take this run's.
    return member_state_dict(saved, int(run.data.tags["member"])) if "members" in saved else saved["model"]


def activations_of(config: dict, model_state: dict):
    """-> (task, the names of the columns, the example in words, the model's activations), or None
    where the model returns none (LSTMs, the DNC, the seq2seq baselines)."""
    # torch and the models take seconds to import; only drawing maps needs them.
    import torch  # noqa: PLC0415

    from trainables.batches import batch_tensors  # noqa: PLC0415 - as torch
    from trainables.steps import make_model  # noqa: PLC0415 - as torch

    cfg = parse_trial_config(config)
    task = load_task(cfg.task, cfg.task_options)
    model = make_model(cfg, task)
    if "return_activations" not in inspect.signature(model.forward).parameters:
        return None
    model.load_state_dict(model_state)
    model.eval()
    split = task.splits[task.test_splits[-1]]
    example = task.kind.example(split)
    batch = batch_tensors(split, np.array([example]), torch.device("cpu"))
    with torch.no_grad():
        _, activations = task.kind.predict(model, batch, return_activations=True)
    if "mode1" in activations:  # PANM: its memory slots are the symbols themselves
        symbols = task.kind.symbols(task, split, example)
        return task, symbols, " ".join(symbols), activations
    names, caption = task.kind.legend(task, split, example, activations["attention"][0].shape[-1])
    return task, names, caption, activations


def plot_transformer(
    pair: str, names: list[str], caption: str, activations: dict, out_dir: Path
) -> tuple[Path, str]:
    """Per layer, the first head's attention (rows attend to columns; `names` the columns), and the
    copy gate's mean over channels per position and layer (Figure 2's bottom row)."""
    plt = pyplot()
    attention = activations["attention"][:MAX_LAYER_PANELS]
    gates = activations.get("gates") or []
    columns = min(7, len(attention))
    rows = -(-len(attention) // columns) + (1 if gates else 0)
    fig, axes = plt.subplots(
        rows, columns, figsize=(max(6.0, 2.2 * columns), 2.3 * rows + 0.6), squeeze=False
    )
    for ax in axes.flat:
        ax.axis("off")
    n = len(names)
    for layer, weights in enumerate(attention):
        ax = axes.flat[layer]
        ax.axis("on")
        ax.imshow(weights[0, 0, :n, :n].numpy(), cmap="viridis", vmin=0, vmax=1)
        ax.set_title(f"layer {layer + 1}", fontsize=8)
        ax.set_xticks(range(n), names, fontsize=5, rotation=90)
        ax.set_yticks(range(n), names, fontsize=5)
    if gates:
        ax = axes[-1][0]
        ax.axis("on")
        update = [g[0, :n].float().mean(-1).numpy() for g in gates]
        ax.imshow(update, cmap="magma", vmin=0, vmax=1, aspect="auto")
        ax.set_title("copy gate (mean update)", fontsize=8)
        ax.set_xticks(range(n), names, fontsize=5, rotation=90)
        ax.set_yticks(range(len(update)), [str(k + 1) for k in range(len(update))], fontsize=5)
        ax.set_ylabel("layer", fontsize=7)
    fig.suptitle(
        f"{pair}, best trial (last checkpoint): head 1's attention per layer\non {caption}", fontsize=8
    )
    path = out_dir / f"{pair}_attention.png"
    return path, figure_png(fig, path)


def plot_pointers(pair: str, labels: list[str], trace: dict, out_dir: Path) -> tuple[Path, str] | None:
    """PANM's pointer attention: per decoding step, each Mode-1 and Mode-2 head's weights over
    the memory slots (the input)."""
    heads = []
    for mode in ("mode1", "mode2"):
        steps = [w for w in trace.get(mode, []) if w is not None]
        if steps:
            stacked = np.stack([w[0].numpy() for w in steps])  # (steps, heads, slots)
            heads += [(f"{mode} head {h + 1}", stacked[:, h, : len(labels)]) for h in range(stacked.shape[1])]
    if not heads:
        return None
    plt = pyplot()
    fig, axes = plt.subplots(1, len(heads), figsize=(max(6.0, 3 * len(heads)), 3), squeeze=False)
    for ax, (title, weights) in zip(axes[0], heads):
        ax.imshow(weights, cmap="viridis", vmin=0, vmax=1, aspect="auto")
        ax.set_title(title, fontsize=8)
        ax.set_xticks(range(len(labels)), labels, fontsize=5, rotation=90)
        ax.set_ylabel("decoding step", fontsize=7)
    fig.suptitle(f"{pair}, best trial (last checkpoint): pointer attention over the input", fontsize=8)
    path = out_dir / f"{pair}_pointers.png"
    return path, figure_png(fig, path)


def best_run_maps(state, pair: str, run, out_dir: Path) -> list[tuple[Path, str]]:
    """The maps of `run` (a pair's best trial) as PNGs in `out_dir`, each with its base64 for the
    page; none where its model returns no activations or its checkpoint is gone. Never raises: a
    missing figure is no reason to fail a launch."""
    try:
        model_state = last_model_state(state, run)
        if model_state is None:
            return []
        found = activations_of(json.loads(run.data.tags[CONFIG_TAG]), model_state)
        if found is None:
            return []
        task, names, caption, activations = found
        out_dir.mkdir(parents=True, exist_ok=True)
        if "mode1" in activations:
            figure = plot_pointers(pair, names, activations, out_dir)
            return [figure] if figure else []
        return [plot_transformer(pair, names, caption, activations, out_dir)]
    except Exception as e:  # see the docstring
        print(
            f"[report] no attention maps for {pair}: {(str(e) or type(e).__name__).splitlines()[0]}",
            flush=True,
        )
        return []
