"""A trial that fails twice the same way: a fault of its model or config, not of a node.

Tune restarts a trial whose process raised as it restarts one whose node died, up to
budget.max_failures times. Restored from the same checkpoint, a trial that raised the same error
before its next evaluation as on its try before would only raise it again: it ends instead, status
failed, with that error as its last result (trial.run_trial). Tune's retries are left to lost
nodes and processes, and to errors of the machine or of Ray (an OSError: a full disk, a dropped
connection; a RayError), which a restart may not meet again. Each trial's last failure is kept in
the launch's trial storage, which every node reaches (a restart may land on another node).
"""

from __future__ import annotations

import dataclasses
import json
import traceback

import pyarrow.fs
from ray import tune
from ray.exceptions import RayError

from ..record.runs import error_line


def error_text(error: BaseException) -> str:
    """An error's traceback as Python prints it: its last line names the error."""
    return "".join(traceback.format_exception(error))


@dataclasses.dataclass(frozen=True)
class FailureLog:
    """Where a phase's trials keep their last failure: `folder` on the pyarrow filesystem `fs`."""

    fs: pyarrow.fs.FileSystem
    folder: str

    def repeated(self, error: BaseException, after: int) -> bool:
        """Whether this trial raised `error` after the evaluation at iteration `after` (0: before its
        first) on its try before too; if not, this failure is kept as its last. Never for an error
        of the machine or of Ray."""
        if isinstance(error, (OSError, RayError)):
            return False
        failure = {"error": error_line(error_text(error)), "after": after}
        path = f"{self.folder}/{tune.get_context().get_trial_id()}.json"
        try:
            with self.fs.open_input_stream(path) as f:
                if json.loads(f.read()) == failure:
                    return True
        except (OSError, ValueError):  # its first failure (or a record cut short)
            pass
        try:
            self.fs.create_dir(self.folder)
            with self.fs.open_output_stream(path) as f:
                f.write(json.dumps(failure).encode())
        except OSError:  # a full disk, say: unrecorded, the failure is retried as any other
            pass
        return False
