"""`orchestrator train`: one trial from a preset or a YAML trial config (a best file), in this
process, with its cost first and its final metrics as JSON last."""

from __future__ import annotations

import copy
import json
import math
import os
from pathlib import Path

from trainables.config import (
    ConfigError,
    check_builds,
    parameter_count,
    parse_trial_config,
    preset,
    set_override,
)
from trainables.devices import cpu_kernels, pick_device
from trainables.models import is_file_model
from trainables.tasks import eval_sizes
from trainables.train import train

from ..record.runs import DATA_HASH_TAG, KERNELS_TAG
from ..run.cost_model import training_cost
from .inputs import UsageError
from .plans import read_yaml


def load_trial_source(source: str) -> tuple[dict, dict]:
    """A YAML trial config file (e.g. written by `orchestrator best`), or a preset 'task/model';
    with what its trial ran on where the file records it (a best file: data_hash, cpu_kernels)."""
    path = Path(source)
    if path.suffix in (".yaml", ".yml") or os.path.exists(source):  # False, not OSError, for a name too long
        data = read_yaml(path)
        if not isinstance(data, dict):
            raise UsageError(f"{source}: expected a mapping of trial config keys")
        ran_on = {key: data[key] for key in (DATA_HASH_TAG, KERNELS_TAG) if "config" in data and key in data}
        return data.get("config", data), ran_on
    if "/" not in source:
        raise UsageError(f"{source}: neither a YAML file nor a preset 'task/model' (e.g. ctl/ndr)")
    task, model = source.split("/", 1)
    if is_file_model(model):  # a model of one's own has no paper's setting: the training defaults
        return {"task": task, "model": model}, {}
    try:
        return preset(task, model), {}
    except ConfigError as e:
        raise UsageError(str(e)) from None


def say_what_differs(recorded: dict, flat: dict) -> None:
    """A line where `--set` changes what a launch's trial ran (a best file's config): its metric then
    does not re-run to the number in the file's header, threads and seed included."""
    changes = [
        f"{key} {recorded.get(key)!r} -> {flat.get(key)!r}"
        for key in sorted(set(recorded) | set(flat))
        if recorded.get(key) != flat.get(key)
    ]
    if changes:
        print(
            f"[train] --set changes the launch's trial ({', '.join(changes)}): the metric does not "
            "re-run to the file's number",
            flush=True,
        )


def cmd_train(args) -> int:

    flat, ran_on = load_trial_source(args.source)
    recorded = copy.deepcopy(flat)
    try:
        for assignment in args.set or []:
            set_override(flat, assignment)
        cfg = parse_trial_config(flat)
    except ConfigError as e:
        raise UsageError(f"{args.source}: {e}") from None
    try:
        check_builds(cfg)  # the same check a launch's space gets
    except ConfigError as e:
        raise UsageError(
            f"{args.source}: model {cfg.model} with its options {cfg.model_options}: {e}"
        ) from None

    try:
        device = pick_device(cfg.device)
    except ConfigError as e:
        raise UsageError(f"{args.source}: {e}") from None
    params, sizes = parameter_count(cfg), eval_sizes(cfg.task, cfg.task_options)
    print(
        training_cost(
            cfg.model, cfg.task, device.type, params, cfg.batch_size, cfg.n_iters, cfg.eval_every, sizes
        ),
        flush=True,
    )
    if ran_on:
        say_what_differs(recorded, flat)
    kernels = cpu_kernels()
    if device.type == "cpu" and ran_on.get(KERNELS_TAG, kernels) != kernels:
        print(
            f"[train] this CPU's kernels are {kernels}, the launch's trial ran on {ran_on[KERNELS_TAG]}: "
            "they round otherwise, so the metric may not re-run to the file's number "
            "(docs/troubleshooting.md#numbers)",
            flush=True,
        )
    metrics = train(cfg)
    if DATA_HASH_TAG in ran_on and metrics["data_hash"] != ran_on[DATA_HASH_TAG]:
        print(
            f"[train] the data differ from the launch's (data_hash {ran_on[DATA_HASH_TAG]} there, "
            f"{metrics['data_hash']} here): the metric does not re-run to the file's number",
            flush=True,
        )
    # The final metrics as JSON (other tools read it), rounded to what a reader compares; a diverged
    # run's NaN loss and missing best are null (JSON has no NaN: jq and others refuse Python's).
    print(
        json.dumps(
            {
                k: (round(v, 4) if math.isfinite(v) else None) if isinstance(v, float) else v
                for k, v in metrics.items()
            },
            indent=2,
            sort_keys=True,
            allow_nan=False,
        )
    )
    return 0 if metrics["status"] == "completed" else 1
