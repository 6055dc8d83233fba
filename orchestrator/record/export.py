"""A launch's trial runs as one table, for pandas, R or a spreadsheet (`orchestrator export`).

Read from the tracking store alone, like `status`: no Ray, no torch.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from .files import atomic_path
from .runs import (
    CONFIG_TAG,
    DATA_HASH_TAG,
    DIVERGED_AT_TAG,
    ERROR_TAG,
    KERNELS_TAG,
    STATUS_TAG,
    error_line,
    launch_trial_runs,
)

FORMATS = ("csv", "parquet")
# The tags that place a run, in this order; cell, candidate and seed only where the launch has them;
# then how it ran (its device, its CPU's kernels, and the compile and bf16 that `auto` chose
# there). A failed run's error is its last line (the traceback is its MLflow run's tag).
TAGS = (
    "trial_id",
    "pair",
    "model",
    "task",
    "variant",
    "phase",
    STATUS_TAG,
    DIVERGED_AT_TAG,
    ERROR_TAG,
    "cell",
    "candidate",
    "seed",
    "member",
    "code_version",
    DATA_HASH_TAG,
    "device",
    KERNELS_TAG,
    "compile",
    "bf16",
)


def flattened(config: dict, prefix: str = "params.") -> dict:
    """`params.<key>` and `params.task_options.<key>`, as pd.json_normalize names the columns."""
    out = {}
    for key, value in config.items():
        out.update(
            flattened(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value}
        )
    return out


def whole_number_keys(configs: list[dict]) -> set[str]:
    """The flattened config keys whose every value is an int: pandas makes such a column float
    where some run lacks the key (another model's), and 4 would read 4.0."""
    types: dict[str, set] = {}
    for config in configs:
        for key, value in flattened(config).items():
            types.setdefault(key, set()).add(type(value))
    return {key for key, seen in types.items() if seen == {int}}


def launch_frame(state) -> pd.DataFrame:
    """One row per trial run of the launch, whatever its status, in the order they started: run_id,
    run_name, start_time and end_time, the tags in TAGS, the trial's config as `params.<key>` (typed,
    nested options flattened: `params.task_options.direction`) and the last value of each metric as
    `metrics.<name>`, as mlflow.search_runs names its columns."""
    rows = []
    for run in launch_trial_runs(state.tracked):
        tags = run.data.tags
        rows.append(
            {
                "run_id": run.info.run_id,
                "run_name": run.info.run_name,
                "start_time": pd.to_datetime(run.info.start_time, unit="ms", utc=True),
                "end_time": pd.to_datetime(run.info.end_time, unit="ms", utc=True)
                if run.info.end_time
                else pd.NaT,
                **{tag: tags[tag] for tag in TAGS if tag in tags},
                **({ERROR_TAG: error_line(tags[ERROR_TAG])} if ERROR_TAG in tags else {}),
                "params": json.loads(tags.get(CONFIG_TAG, "{}")),
                "metrics": run.data.metrics,
            }
        )
    frame = pd.json_normalize(rows, sep=".")
    for tag in (
        "candidate",
        "seed",
        "member",
        DIVERGED_AT_TAG,
    ):  # MLflow keeps tags as text; these are numbers to sort and group by
        if tag in frame:
            frame[tag] = pd.to_numeric(frame[tag]).astype("Int64")
    if "bf16" in frame:  # and this a yes or no
        frame["bf16"] = frame["bf16"].map({"true": True, "false": False}).astype("boolean")
    for column in whole_number_keys([row["params"] for row in rows]) & set(frame.columns):
        frame[column] = frame[column].astype("Int64")
    leading = [c for c in ("run_id", "run_name", "start_time", "end_time", *TAGS) if c in frame]
    return frame[
        leading
        + sorted(c for c in frame.columns if c.startswith("params."))
        + sorted(c for c in frame.columns if c.startswith("metrics."))
    ]


# A CSV's compression, by the name's last suffix, as pandas infers it: its temporary's name has none.
COMPRESSIONS = {".gz": "gzip", ".bz2": "bz2", ".zip": "zip", ".xz": "xz"}  # the standard library's


def write_frame(frame: pd.DataFrame, path: Path, fmt: str) -> None:
    if fmt == "parquet":
        # A Parquet column has one type: a config key that is a number in one pair and text in another
        # is written as text.
        mixed = [
            c for c in frame.columns if frame[c].dtype == object and frame[c].dropna().map(type).nunique() > 1
        ]
        frame = frame.astype({c: "string" for c in mixed})
    with atomic_path(path) as temporary:
        if fmt == "csv":
            frame.to_csv(temporary, index=False, compression=COMPRESSIONS.get(Path(path).suffix))
        else:
            frame.to_parquet(temporary, index=False)
