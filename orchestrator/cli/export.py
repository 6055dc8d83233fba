"""`orchestrator export`: a launch's trial runs as one table."""

from __future__ import annotations

from pathlib import Path

from ..record.export import FORMATS, launch_frame, write_frame
from ..record.stores import unwritable
from .inputs import UsageError, load_state


def cmd_export(args) -> int:
    """From launch.json and the tracking store only, as `status`."""
    suffix = Path(args.output).suffix.lstrip(".") if args.output else ""
    fmt = args.format or (suffix if suffix in FORMATS else "csv")
    if fmt not in FORMATS:
        raise UsageError(f"--format: unknown format {fmt!r}; expected {' or '.join(FORMATS)}")
    state = load_state(args)
    path = Path(args.output) if args.output else state.dir / "export" / f"runs.{fmt}"
    where = "--output" if args.output else "export"
    problem = unwritable(path.parent) or (f"{path} is a folder" if path.is_dir() else None)
    if problem:
        raise UsageError(f"{where}: cannot write {path} ({problem})")
    frame = launch_frame(state)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_frame(frame, path, fmt)
    except OSError as e:
        raise UsageError(f"{where}: cannot write {path} ({e.strerror or e})") from None
    print(path)
    print(f"{len(frame)} runs x {len(frame.columns)} columns")
    return 0
