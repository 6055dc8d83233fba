"""`orchestrator board`: the reproduction board over the finished launches of a folder."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

from ..record.secrets import redact
from ..record.stores import TrackingError, check_store, normalize_store, unwritable
from ..report import board
from .inputs import UsageError


def cmd_board(args) -> int:
    """The reproduction board over the finished launches under --storage-path (report/board.py)."""
    storage = Path(args.storage_path)
    if not os.path.isdir(storage):  # False, not OSError, for a name too long
        raise UsageError(f"--storage-path: no such folder {storage}")
    if args.tracking_uri and redact(args.tracking_uri) != args.tracking_uri:
        raise UsageError(
            "--tracking-uri: holds a password, which `ps` shows every user of this machine; set "
            "MLFLOW_TRACKING_URI to this URI instead"
        )
    uri = args.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    args.store_uri = uri
    uri, output = uri and normalize_store(uri), Path(args.output) if args.output else None
    if uri:  # the board is logged there: the check a launch's store gets
        try:
            check_store(uri)
        except TrackingError as e:
            raise UsageError(
                f"{'--tracking-uri' if args.tracking_uri else 'MLFLOW_TRACKING_URI'}: {e}"
            ) from None
    if output and (problem := unwritable(output)):
        raise UsageError(f"--output: cannot write the board in {output} ({problem})")
    docs = None
    if args.docs:
        try:
            problem = board.docs_problem(Path(args.docs))
            if not problem and output and Path(args.docs).resolve() == output.resolve():
                problem = "the folder --output names, not a page"
        except (OSError, RuntimeError, ValueError) as e:  # a name too long, a symlink loop, a NUL
            problem = f"not a usable path ({getattr(e, 'strerror', None) or e})"
        if problem:
            raise UsageError(problem, f"--docs: {args.docs}: ")
        tracking = ["--tracking-uri", args.tracking_uri] if args.tracking_uri else []
        words = ["orchestrator", "board", "--storage-path", args.storage_path, *tracking, "--docs", args.docs]
        docs = (Path(args.docs), shlex.join(words))
    paths, context = board.write(storage, uri, args.mlflow_url, output, not args.no_links, docs)
    print(f"board of the {context['launches']} finished launches in {storage}: {board.counts(context)}")
    for path in paths:
        print(f"  {path}")
    return 0
