"""Task registry: the name used in YAML -> config dataclass, loader and task kind."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..fields import closest
from ..kinds import Kind
from . import (
    algorithmic,
    arithmetic,
    babi,
    ctl,
    dyck,
    esbn,
    listops,
    mathematics,
    multi30k,
    retrieval,
    scan,
    sizes,
    sort_of_clevr,
    triangles,
)
from .base import Task
from .sizes import EvalSizes


@dataclass(frozen=True)
class TaskSpec:
    config: type
    load: Callable[[Any], Task]
    probe: Callable[[Any], Task]  # the task without its data, for building models before launch
    kind: Kind  # the task module's KIND, which its tasks name too: stated once, there
    eval_sizes: Callable[[Any], EvalSizes | None]  # what an evaluation scores, without the data (sizes.py)


TASKS: dict[str, TaskSpec] = {
    "ctl": TaskSpec(ctl.CTLConfig, ctl.load, ctl.probe, ctl.KIND, sizes.ctl),
    "arithmetic": TaskSpec(
        arithmetic.ArithmeticConfig,
        arithmetic.load,
        arithmetic.probe,
        arithmetic.KIND,
        sizes.expressions,
    ),
    "listops": TaskSpec(listops.ListOpsConfig, listops.load, listops.probe, listops.KIND, sizes.expressions),
    **{
        name: TaskSpec(
            algorithmic.AlgorithmicConfig,
            algorithmic.loader(name),
            functools.partial(algorithmic.probe, name),
            algorithmic.KIND,
            functools.partial(sizes.algorithmic_sizes, name),
        )
        for name in algorithmic.TASK_NAMES
    },
    "contextual_retrieval": TaskSpec(
        retrieval.RetrievalConfig, retrieval.load, retrieval.probe, retrieval.KIND, sizes.retrieval
    ),
    "scan": TaskSpec(scan.ScanConfig, scan.load, scan.probe, scan.KIND, sizes.scan_sizes),
    "mathematics": TaskSpec(
        mathematics.MathematicsConfig,
        mathematics.load,
        mathematics.probe,
        mathematics.KIND,
        sizes.unknown,
    ),
    "triangles": TaskSpec(
        triangles.TrianglesConfig, triangles.load, triangles.probe, triangles.KIND, sizes.triangles
    ),
    "babi": TaskSpec(babi.BabiConfig, babi.load, babi.probe, babi.KIND, sizes.unknown),
    "multi30k": TaskSpec(
        multi30k.Multi30kConfig, multi30k.load, multi30k.probe, multi30k.KIND, sizes.unknown
    ),
    "esbn": TaskSpec(esbn.ESBNConfig, esbn.load, esbn.probe, esbn.KIND, sizes.esbn_sizes),
    "dyck": TaskSpec(dyck.DyckConfig, dyck.load, dyck.probe, dyck.KIND, sizes.dyck_sizes),
    "sort_of_clevr": TaskSpec(
        sort_of_clevr.SortOfClevrConfig,
        sort_of_clevr.load,
        sort_of_clevr.probe,
        sort_of_clevr.KIND,
        sizes.sort_of_clevr,
    ),
}


def unknown_task(name) -> str:
    """What to say of a name that names no task."""
    return f"unknown task {name!r}{closest(str(name), TASKS)}; known: {', '.join(TASKS)}"


def task_config(name: str, options: dict | None = None):
    """Typed config for a task from YAML options; unknown names and keys raise KeyError/TypeError,
    values no generator can take ValueError."""
    if name not in TASKS:
        raise KeyError(unknown_task(name))
    cls = TASKS[name].config
    fields = {f.name: f for f in dataclasses.fields(cls)}
    values = {}
    for key, value in (options or {}).items():
        if key not in fields:
            raise TypeError(f"task {name!r} has no option {key!r}; options: {', '.join(fields)}")
        values[key] = tuple(value) if isinstance(value, list) else value
        if str(fields[key].type).startswith("int") and isinstance(value, float) and value.is_integer():
            values[key] = int(value)  # 100.0 as the training keys take it: a generator counts with ints
    return cls(**values)  # each config checks its values (base.check_values)


def eval_sizes(name: str, options: dict | None = None) -> EvalSizes | None:
    """What an evaluation of the task scores (sizes.py), without its data; None where only the data
    know."""
    spec = TASKS[name]
    sizes = spec.eval_sizes(task_config(name, options))
    return sizes and dataclasses.replace(sizes, decodes=spec.kind.decodes)


def load_task(name: str, options: dict | None = None) -> Task:
    return TASKS[name].load(task_config(name, options))


def small_copy_options(name: str, options: dict, train_rows: int, eval_rows: int) -> dict:
    """`options` with the task's splits cut to about `train_rows` training samples and `eval_rows`
    per evaluation set, by whichever options size them: a copy of the task to time training steps
    on (a launch's calibration). Tasks read whole from their files or generator (SCAN, bAbI,
    Multi30K) keep their training set and cut only what they evaluate."""
    defaults = {f.name: f.default for f in dataclasses.fields(TASKS[name].config)}
    out = dict(options)

    def cap(key: str, limit: int) -> None:
        if key in defaults:
            now = out.get(key, defaults[key])
            out[key] = limit if now is None or now is dataclasses.MISSING else min(now, limit)

    cap("train_size", train_rows)
    cap("eval_size", eval_rows)
    if "train_images" in defaults:  # Sort-of-CLEVR: questions_per_type questions of each of 3 types per image
        per_image = 3 * out.get("questions_per_type", defaults["questions_per_type"])
        cap("train_images", -(-train_rows // per_image))
        cap("eval_images", -(-eval_rows // per_image))
    return out
