"""The files a launch or a trial is given, read and checked: a YAML file, a search or ablation
file's Study with the command line's overrides, and the ablations a nightly file lists."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import yaml

from ..plan import source
from ..plan.load import load_study
from ..plan.sections import parse_budget
from ..plan.source import SpecError
from ..plan.storage import TrialStorage
from ..plan.study import Report
from ..record.secrets import redact
from ..record.stores import TrackingError, check_store, normalize_store
from .inputs import UsageError


def read_yaml(path: Path):
    """A YAML file the user named, or a UsageError in one line naming it (and the line at fault)."""
    try:
        return source.read_yaml(path)
    except SpecError as e:
        raise UsageError.of_spec(e) from None


def validated(
    spec_file: str, tracking_uri: str | None = None, storage: str | None = None, text: str | None = None
):
    """The Study of `spec_file` (or of `text`, read as that file), with `tracking_uri` and `storage`
    overriding the file's, and its text, with the tracking store reachable; UsageError otherwise."""
    try:
        study = load_study(spec_file, text=text)
    except SpecError as e:
        raise UsageError.of_spec(e) from None
    if storage:
        # The endpoint of an object store stays the file's: the flag moves the data, not the server.
        flag = TrialStorage(storage)
        study = dataclasses.replace(
            study, storage=TrialStorage(storage, study.storage.endpoint) if flag.is_object_store else flag
        )
        try:
            study.storage.validate()
        except ValueError as e:
            raise UsageError(f"--storage: {e}") from None
    if tracking_uri and redact(tracking_uri) != tracking_uri:
        raise UsageError(
            "--tracking-uri: holds a password, which `ps` shows every user of this machine for as long as "
            "the launch runs; set MLFLOW_TRACKING_URI to this URI instead"
        )
    from_env = os.environ.get("MLFLOW_TRACKING_URI")
    # The flag, then the environment (where a password can stay out of files and command lines), then
    # the file.
    uri = normalize_store(tracking_uri or from_env or study.tracking.uri)
    study = dataclasses.replace(study, tracking=dataclasses.replace(study.tracking, uri=uri))
    try:
        check_store(study.tracking.uri)
    except TrackingError as e:
        where = (
            "--tracking-uri"
            if tracking_uri
            else ("MLFLOW_TRACKING_URI" if from_env else f"{spec_file}: tracking.uri")
        )
        raise UsageError(f"{where}: {e}") from None
    return study, text if text is not None else Path(spec_file).read_text()


NIGHTLY_KEYS = {"ablations", "budget"}


def nightly_files(path: str) -> list[tuple[str, str | None]]:
    """(file, text) of each ablation a nightly run covers: FILE itself (text None: read as is), or
    the files FILE lists under `ablations` (relative to FILE's folder), each with FILE's `budget`
    over its own."""
    try:
        raw = read_yaml(Path(path))
    except UsageError:
        raw = None  # load_study reports it, with its line or reason
    if not isinstance(raw, dict) or "ablations" not in raw:
        return [(path, None)]
    for key in raw:
        if key not in NIGHTLY_KEYS:
            raise UsageError(f"{path}: {key}: unknown key in a nightly file; valid: ablations, budget")
    files, budget = raw["ablations"], raw.get("budget") or {}
    if not isinstance(files, list) or not files or not all(isinstance(f, str) for f in files):
        raise UsageError(f"{path}: ablations: expected a list of ablation files, got {files!r}")
    if not isinstance(budget, dict):
        raise UsageError(
            f"{path}: budget: expected a mapping (n_iters, eval_every, max_concurrent, ...), got {budget!r}"
        )
    try:  # here, or the first listed file would be blamed for it
        parse_budget(budget, path)
    except SpecError as e:
        raise UsageError.of_spec(e) from None
    out = []
    for k, name in enumerate(files):
        listed = Path(os.path.normpath(Path(path).parent / name))
        if not listed.exists():
            raise UsageError(f"{path}: ablations: no such file {name} (looked in {listed.parent})")
        if str(listed) in (file for file, _ in out):  # its night would run twice, on the same seeds
            raise UsageError(f"{path}: ablations[{k}]: {name} is listed twice")
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
