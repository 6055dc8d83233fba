"""The files a launch or a trial is given, read and checked: a YAML file, and a search or ablation
file's Study with the command line's overrides."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from ..plan import source
from ..plan.load import load_study
from ..plan.source import SpecError
from ..plan.storage import TrialStorage
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
