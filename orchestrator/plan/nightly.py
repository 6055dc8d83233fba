"""A nightly file: the ablations one night runs, each with the file's budget over its own and, where
it lists several, its share of the night's false-alarm rate."""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from .sections import parse_budget
from .source import SpecError, read_yaml
from .study import Report

NIGHTLY_KEYS = {"ablations", "budget"}


def nightly_files(path: str) -> list[tuple[str, str | None]]:
    """(file, text) of each ablation a nightly run covers: FILE itself (text None: read as is), or
    the files FILE lists under `ablations` (relative to FILE's folder), each with FILE's `budget`
    over its own; a SpecError where FILE is a nightly file in error."""
    try:
        raw = read_yaml(Path(path))
    except SpecError:
        raw = None  # load_study reports it, with its line or reason
    if not isinstance(raw, dict) or "ablations" not in raw:
        return [(path, None)]
    for key in raw:
        if key not in NIGHTLY_KEYS:
            raise SpecError(path, key, "unknown key in a nightly file; valid: ablations, budget")
    files, budget = raw["ablations"], raw.get("budget") or {}
    if not isinstance(files, list) or not files or not all(isinstance(f, str) for f in files):
        raise SpecError(path, "ablations", f"expected a list of ablation files, got {files!r}")
    if not isinstance(budget, dict):
        raise SpecError(
            path, "budget", f"expected a mapping (n_iters, eval_every, max_concurrent, ...), got {budget!r}"
        )
    parse_budget(budget, path)  # here, or the first listed file would be blamed for it
    out = []
    for k, name in enumerate(files):
        listed = Path(os.path.normpath(Path(path).parent / name))
        if not listed.exists():
            raise SpecError(path, "ablations", f"no such file {name} (looked in {listed.parent})")
        if str(listed) in (file for file, _ in out):  # its night would run twice, on the same seeds
            raise SpecError(path, f"ablations[{k}]", f"{name} is listed twice")
        data = read_yaml(listed)
        if (
            isinstance(data, dict) and budget and isinstance(data.get("budget") or {}, dict)
        ):  # else load_study names the bad budget
            data["budget"] = {**(data.get("budget") or {}), **budget}
        own = data.get("report") if isinstance(data, dict) else None
        alpha = (own or {}).get("alpha", Report.alpha) if isinstance(own or {}, dict) else None
        if len(files) > 1 and isinstance(alpha, (int, float)) and not isinstance(alpha, bool):
            # A night exits 1 when any file regresses: the files share its false-alarm rate.
            data["report"] = {**(own or {}), "alpha": alpha / len(files)}
        out.append(
            (
                str(listed),
                f"# {listed} with the budget of {path}"
                f"{' and 1/' + str(len(files)) + ' of its alpha' if len(files) > 1 else ''}\n"
                + yaml.safe_dump(data, sort_keys=False),
            )
        )
    return out
