"""A launch's folder on the driver, read without importing Ray, MLflow or torch (`list` and `status`
stay fast): `launch.json` (the spec text, tracking store, parent run, trial storage, state and the
plan `status` prints) and `driver.lock`, which a running driver holds and touches every
HEARTBEAT_S seconds, so that a driver on another machine (a shared launch folder) is told apart
from a dead one.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import threading
import time
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

import yaml

from ..plan.storage import TrialStorage
from .files import write_atomically

SEED_STRIDE = 1000  # night k of a nightly job trains the file's seeds + k * SEED_STRIDE
# Tune's snapshots and the searcher's name our classes by their modules (pickles refer to them so):
# 1, orchestrator.<module>, before the split into plan/run/record/report; 2, run.launch's Tune
# wiring; 3, run.tuner's (Tune's config names its trial_dirname) and the plan's frozen values
# (plan.study.FrozenDict in the searcher's and the trainable's configs).
SNAPSHOT_MODULES = 3
HEARTBEAT_S = 30.0
SILENT_S = 4 * HEARTBEAT_S  # a driver elsewhere not heard from for this long is taken for dead


class DamagedLaunch(ValueError):
    """A launch.json that does not load (a hand edit, a partial copy, another tool's file)."""


@dataclass(frozen=True)
class TrackedLaunch:
    """Where a launch's runs are: its tracking store, its MLflow experiment, and the launch_id tag
    its runs carry (LaunchState.tracked; a launch registering has no state yet)."""

    uri: str
    experiment: str
    launch_id: str


@dataclass
class LaunchState:
    launch_id: str
    dir: Path
    experiment: str  # the MLflow experiment, also what makes launches of one file comparable
    spec_file: str
    spec_text: str
    tracking_uri: str
    parent_run_id: str
    storage: dict = field(default_factory=dict)  # TrialStorage fields: where Tune's experiment lives
    state: str = "running"  # running | interrupted | failed | finished
    plan: dict = field(default_factory=dict)  # see plan_of: what status shows without parsing the spec
    night: int | None = None  # the nightly job's count of this file's nights before this one
    created: float = 0.0  # time.time() at registration
    candidates: dict | None = (
        None  # a search with `confirm`: per pair, the configs of its best trials, best first
    )
    # How the launch's runs stack, decided once at launch (run.stacking: Stacking.record, read back
    # by `launched`): the spec's batch_seeds with auto resolved (whether trials got GPUs), and
    # budget.stack_size auto as measured per pair.
    batch_seeds: bool | None = None
    stack_sizes: dict = field(default_factory=dict)
    snapshot_modules: int = 1  # SNAPSHOT_MODULES of the code that began it (a launch.json without it: 1)
    regressed: bool | None = None  # a night's verdict: whether it regressed from its baseline night
    accepted: bool = (
        False  # `orchestrator accept`: its regression was intended, so later nights compare with it
    )
    # A launch folder moved since it began (follow_move): where it was, and its recorded store and
    # storage, which it keeps saving: Tune's pickles and MLflow's records name places under it.
    moved_from: Path | None = field(default=None, init=False, repr=False)
    recorded: dict = field(default_factory=dict, init=False, repr=False)

    def save(self) -> None:
        data = {
            f.name: (str(v) if isinstance(v, Path) else v)
            for f in fields(self)
            if f.init
            for v in [getattr(self, f.name)]
        }
        data.update(self.recorded)
        write_atomically(self.dir / "launch.json", json.dumps(data, indent=2))

    @classmethod
    def load(cls, launch_dir: Path) -> LaunchState:
        try:
            data = json.loads((launch_dir / "launch.json").read_text())
            if not isinstance(data, dict):
                raise TypeError(f"not an object but a {type(data).__name__}")
            # Where it is now: a launch folder copied to a laptop, or mounted elsewhere in a pod, is read
            # there.
            recorded, data["dir"] = data.get("dir"), Path(launch_dir).resolve()
            check_types(data)
            check_plan(data.get("plan", {}))
            state = cls(**{f.name: data[f.name] for f in fields(cls) if f.init and f.name in data})
        # unreadable, not JSON (or nested past the parser's depth), not an object, fields missing or of
        # another type, a plan no reader can read
        except (OSError, ValueError, TypeError, RecursionError) as e:
            raise DamagedLaunch(
                f"{launch_dir}/launch.json: not a launch record this version can read ({e})"
            ) from None
        if isinstance(recorded, str) and Path(recorded) != state.dir:
            state.follow_move(Path(recorded))
        return state

    def follow_move(self, recorded: Path) -> None:
        """Read a launch folder moved, with what lay beside it, from `recorded` (a results folder
        moved off scratch, or copied to a laptop): its SQLite store and its local trial storage,
        where they are gone from their recorded places, at the same places relative to the folder."""
        self.moved_from = recorded
        self.recorded = {"dir": str(recorded), "tracking_uri": self.tracking_uri, "storage": self.storage}
        if self.tracking_uri.startswith("sqlite:///") and (
            store := moved(Path(self.tracking_uri[len("sqlite:///") :]), recorded, self.dir)
        ):
            self.tracking_uri = f"sqlite:///{store}"
        uri = self.storage.get("uri")
        if isinstance(uri, str) and "://" not in uri and (folder := moved(Path(uri), recorded, self.dir)):
            self.storage = {**self.storage, "uri": str(folder)}

    def here(self, path: Path) -> Path:
        """`path`, recorded by the launch (an artifact folder), where the launch folder's move puts it."""
        if self.moved_from is None:
            return path
        return moved(path, self.moved_from, self.dir, must_exist=False) or path

    def study(self):
        """The launch's Study; a night of the nightly job trains its own seeds (same code, new
        seeds: what a regression test across seeds compares). How it stacks is batch_seeds' and
        stack_sizes' (run.stacking.launched)."""
        # Here, not at the top: the plan imports the task and model registries (numpy, each task's
        # module: 0.3 s), which `--help`, `status` and `best` go without (launch.json is theirs).
        from ..plan.load import load_study  # noqa: PLC0415
        from ..plan.source import SpecError  # noqa: PLC0415

        try:
            study = load_study(self.spec_file, text=self.spec_text, recorded=True)
        except SpecError as e:  # the file as it was launched, kept in launch.json: an edit there broke it
            raise DamagedLaunch(f"{self.dir}/launch.json: spec_text: {e}") from None
        if self.night:
            study = replace(study, seeds=[seed + self.night * SEED_STRIDE for seed in study.seeds])
        return study

    def trial_storage(self):
        try:
            return TrialStorage(**self.storage)
        except TypeError as e:
            raise DamagedLaunch(f"{self.dir}/launch.json: storage: {e}") from None

    def the_plan(self) -> dict:
        """The plan saved at launch; a launch from before plans were saved parses its spec (slower)."""
        return self.plan or plan_of(self.study())

    def edits(self) -> list[str]:
        """What the search-space file says now that it did not when the launch began ("budget.trials:
        5 -> 3"); none where it is unchanged, gone, or no longer YAML a launch would take."""
        path = Path(self.spec_file)
        try:
            now = path.read_text()
            if now == self.spec_text:
                return []
            before, after = flat(yaml.safe_load(self.spec_text)), flat(yaml.safe_load(now))
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            return []
        return [
            f"{key}: {before.get(key, '(none)')} -> {after.get(key, '(none)')}"
            for key in {**before, **after}
            if before.get(key, MISSING) != after.get(key, MISSING)
        ]

    @property
    def tracked(self) -> TrackedLaunch:
        return TrackedLaunch(self.tracking_uri, self.experiment, self.launch_id)

    def optuna_study_name(self, pair: str) -> str:
        """The Optuna study of a search's pair, in optuna_store.search_storage."""
        return f"{self.experiment}/{self.launch_id}/{pair}"


MISSING = object()


def flat(data, key: str = "") -> dict:
    """A YAML document as dotted keys ("budget.trials"), lists and scalars as values."""
    if not isinstance(data, dict) or not data:
        return {key: data} if key else {}
    return {k2: v2 for k, v in data.items() for k2, v2 in flat(v, f"{key}.{k}" if key else str(k)).items()}


def moved(path: Path, recorded: Path, now: Path, must_exist: bool = True) -> Path | None:
    """Where `path` went when the launch folder went from `recorded` to `now`, or None: the smallest
    folder that held both moved with the launch folder (not the filesystem's root), `path` is gone
    from its old place, and (with `must_exist`) it is at the new one."""
    if not (path.is_absolute() and recorded.is_absolute()) or path.exists():
        return None
    common = Path(os.path.commonpath([path, recorded]))
    if common == Path(common.anchor):
        return None
    there = Path(os.path.normpath(now / os.path.relpath(path, recorded)))
    if not Path(os.path.normpath(now / os.path.relpath(common, recorded))).is_dir():
        return None
    return there if there.exists() or not must_exist else None


FIELD_TYPES = {
    "str": (str,),
    "dict": (dict,),
    "float": (int, float),
    "int": (int,),
    "bool": (bool,),
    "None": (type(None),),
}


def check_types(data: dict) -> None:
    """Each field of a launch record of its own type: `"launch_id": 5` was read as a launch whose
    runs the store does not hold, and `report` wrote over the launch's report an empty one."""
    for f in fields(LaunchState):
        if f.name == "dir" or not f.init or f.name not in data:
            continue
        value, kinds = data[f.name], [kind.strip() for kind in f.type.split("|")]
        if not any(
            isinstance(value, FIELD_TYPES[kind]) and (kind in ("bool", "None") or not isinstance(value, bool))
            for kind in kinds
        ):
            raise TypeError(f"{f.name}: expected {f.type}, got {type(value).__name__}")


def check_plan(plan) -> None:
    """A saved plan `status` and `best` can read: none (a launch from before plans were saved), or one
    with every key they read without a default."""
    if not isinstance(plan, dict):
        raise TypeError(f"plan: not an object, got {type(plan).__name__}")
    if missing := [
        key for key in ("metric", "mode", "score", "ablation", "pairs") if plan and key not in plan
    ]:
        raise ValueError(f"plan: lacks {', '.join(missing)}")
    if wrong := [key for key in ("metric", "mode", "score") if plan and not isinstance(plan[key], str)]:
        raise ValueError(f"plan: {', '.join(wrong)} not text")
    pairs = plan.get("pairs", [])

    def readable(pair) -> bool:
        return (
            isinstance(pair, dict)
            and isinstance(pair.get("name"), str)
            and isinstance(pair.get("trials"), int)
            and "chance" in pair
            and isinstance(pair.get("grid") or {}, dict)
        )

    if not isinstance(pairs, list) or not all(map(readable, pairs)):
        raise ValueError(
            "plan.pairs: not a list of pairs, each with a name, a trial count, a chance level and its grid"
        )


def plan_of(study) -> dict:
    """What `status` and `best` need of the spec. Launches from before a key was saved lack it:
    readers default `asha` to True, and take an ablation's cells from its runs' tags."""
    return {
        "metric": study.metric,
        "mode": study.mode,
        "score": study.score,
        "headline": study.headline,
        "ablation": study.is_ablation,
        "confirm": study.confirm_count(),
        "top_k": study.confirm.top_k,
        "seeds": len(study.seeds),
        "asha": study.uses_asha,
        "pairs": [
            {"name": p.name, "trials": study.trial_count(p), "chance": p.chance(study.score), "grid": p.grid}
            for p in study.pairs
        ],
    }


def headline_of(plan: dict) -> str:
    """The plan's headline test score (Study.headline); a plan saved before it was: the mean test."""
    return plan.get("headline") or f"test_{plan['score']}_at_best"


def find_launch(storage_path: str, launch_id: str | None) -> Path:
    """A launch folder by id or path; without one, the launch under storage_path started last (not
    the one whose launch.json was written last: `accept` and `resume` rewrite an old one's)."""
    if launch_id:
        for candidate in (Path(launch_id), Path(storage_path) / launch_id):
            if (candidate / "launch.json").exists():
                return candidate.resolve()
        raise FileNotFoundError(
            f"no launch {launch_id!r} (looked for {launch_id}/launch.json and "
            f"{storage_path}/{launch_id}/launch.json)"
        )
    launches = sorted(Path(storage_path).glob("*/launch.json"), key=started_at)
    if not launches:
        raise FileNotFoundError(f"no launches under {storage_path}/")
    return launches[-1].parent.resolve()


def started_at(launch_json: Path) -> float:
    """When a launch began: its `created`, else (a launch from before it, a damaged file) its file's time."""
    try:
        return float(json.loads(launch_json.read_text()).get("created") or launch_json.stat().st_mtime)
    except (OSError, ValueError, AttributeError, TypeError, RecursionError):
        return launch_json.stat().st_mtime


def readable_launches(storage_path: Path) -> list[LaunchState]:
    """The launches under `storage_path` whose records load; a damaged one is no reason to refuse the rest."""
    out = []
    for path in Path(storage_path).glob("*/launch.json"):
        try:
            out.append(LaunchState.load(path.parent))
        except DamagedLaunch:
            continue
    return out


def earlier_launches(state: LaunchState, nightly: bool = False) -> list[LaunchState]:
    """The other finished launches of the same file (its name; in the same MLflow experiment) under
    the same folder that started before this one, oldest first; with `nightly`, only the nightly
    job's nights. Two files may share an experiment: a night is never compared with another file's."""
    found = []
    for other in readable_launches(state.dir.parent):
        if (
            other.launch_id == state.launch_id
            or other.experiment != state.experiment
            or not same_file(other, state)
        ):
            continue
        if other.state != "finished" or (nightly and other.night is None):
            continue
        found.append(other)
    # The file's time: launches from before `created`.
    started = lambda s: s.created or (s.dir / "launch.json").stat().st_mtime
    return sorted((s for s in found if started(s) < started(state)), key=started)


def baseline_nights(nights: list[LaunchState]) -> list[LaunchState]:
    """The nights a later night may be compared with: those that flagged no regression, or whose
    regression was accepted. A regression compared only with the night before would be flagged
    once and then pass, compared with itself, every night after."""
    return [n for n in nights if not n.regressed or n.accepted]


def same_file(a: LaunchState, b: LaunchState) -> bool:
    """Whether two launches ran the same file: by its name, as a nightly file lists it by a path
    of its own (`../ablations/x.yaml`) and a cluster's nodes mount the repository elsewhere."""
    return Path(a.spec_file).name == Path(b.spec_file).name


def previous_launch(state: LaunchState) -> LaunchState | None:
    """The most recent earlier finished launch of the same search-space file under the same folder."""
    earlier = earlier_launches(state)
    return earlier[-1] if earlier else None


# What a launch writes in its folder, and whether each is a folder: `resume` checks them before Ray
# starts.
WRITTEN = {"driver.lock": False, "report": True, "best": True, "export": True}


def misplaced(launch_dir: Path) -> str | None:
    """The first of WRITTEN in `launch_dir` that is of the other kind (a file where a folder belongs),
    said."""
    for name, folder in WRITTEN.items():
        path = launch_dir / name
        if path.exists() and path.is_dir() != folder:
            return f"{path}: {'a file where a folder' if folder else 'a folder where a file'} belongs"
    return None


def driver(launch_dir: Path) -> tuple[bool, str]:
    """(whether a driver runs the launch now, where it runs). On this machine the lock says (a dead
    driver's lock is released); a driver on another machine is alive while its heartbeat is recent."""
    lock = launch_dir / "driver.lock"
    if not lock.exists():
        return False, ""
    if not lock.is_file():  # no driver made it: none can hold it
        return False, f"{lock} is not a file"
    with open(lock) as f:
        host = (f.read().split() or [""])[0]
        if host and host != socket.gethostname():
            silent = time.time() - lock.stat().st_mtime
            if silent < SILENT_S:
                return True, f"on {host}, heard from {silent:.0f} s ago"
            return False, f"on {host}, silent for {silent / 60:.0f} min"
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True, "on this machine"
        fcntl.flock(f, fcntl.LOCK_UN)
        return False, "on this machine"


def describe(state: LaunchState, driver_now: tuple[bool, str]) -> str:
    """The launch's state in words, with the command that continues it where one is needed;
    `driver_now` is driver(state.dir), asked once by the caller for all it prints."""
    alive, where = driver_now
    if alive:
        return f"running (its driver is alive, {where})"
    if state.state in ("running", "interrupted", "failed"):
        gone = f"driver gone ({where}; killed?)" if state.state == "running" else state.state
        return f"{gone}; continue with: orchestrator resume {state.dir}"
    return state.state


class Heartbeat:
    """Touches `path` every HEARTBEAT_S seconds from a daemon thread while in the `with` block."""

    def __init__(self, path: Path):
        self.path, self.stop = path, threading.Event()

    def beat(self) -> None:
        while not self.stop.wait(HEARTBEAT_S):
            os.utime(self.path)

    def __enter__(self):
        threading.Thread(target=self.beat, daemon=True, name="driver-heartbeat").start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
