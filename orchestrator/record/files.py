"""Files a reader may open at any moment (launch.json, a report and its figures, the board, best
configs, an export) are written whole or not at all: to a temporary name in the same folder, flushed
to the disk, then renamed onto the file. A writer killed mid-write, or a full disk, leaves the old
file or the new one, never a torn or empty one (docs/guide/faults.md#files-written-whole)."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """A temporary path beside `path`, for a writer that needs a path (pandas, matplotlib): renamed
    onto `path` when the block ends, removed where it raises. Its name ends in `.tmp`, so that no
    glob of the folder's own files (`*.yaml`, `*.png`) finds it."""
    path = Path(path)
    temporary = path.parent / f".{path.name}.{uuid.uuid4().hex[:8]}.tmp"
    # Made here, with the mode a plain open() gives (the umask's), which the writer's open keeps.
    os.close(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    try:
        yield temporary
        handle = os.open(temporary, os.O_RDONLY)
        try:
            os.fsync(handle)  # on the disk before the rename, so the name never points at a hole
        finally:
            os.close(handle)
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def write_atomically(path: Path, data: str | bytes) -> None:
    """`data` (text as UTF-8) as the whole of `path`, or `path` as it was (atomic_path)."""
    with atomic_path(path) as temporary:
        temporary.write_bytes(data.encode() if isinstance(data, str) else data)
