"""`orchestrator train | launch | nightly | resume | status | best | report | export | dashboard | ui |
accept | board | list`: one entry point for the service."""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import importlib.metadata
import json
import math
import os
import shlex
import signal
import socket
import sys
import threading
import traceback
import urllib.parse
from pathlib import Path

import yaml

# Only what imports in a blink: `status`, `best`, `list` and `--help` must not wait for Ray or torch.
from .plan.storage import StorageError, TrialStorage
from .record.best import searched_and_ablation, summaries_of, write_ablation, write_best
from .record.mlflow_ui import DEFAULT_URL, Server, free_port, launch_lines
from .record.retries import StoreUnavailable, retry_delays
from .record.runs import launch_trial_runs
from .record.secrets import redact, redact_secrets
from .record.state import (
    SEED_STRIDE,
    SNAPSHOT_MODULES,
    DamagedLaunch,
    LaunchState,
    describe,
    driver,
    find_launch,
    misplaced,
    previous_launch,
    readable_launches,
    started_at,
)
from .record.stores import (
    TrackingError,
    check_store,
    damaged_store,
    missing_sqlite_file,
    normalize_store,
    reveal,
    store_exists,
    unwritable,
)
from .record.summaries import (
    failed_text,
)
from .record.tables import launch_table
from .run.cluster import ClusterUnreachable
from .run.cost_model import training_cost
from .run.exits import EXIT_INTERRUPTED, EXIT_READER_GONE, EXIT_STORE_UNREACHABLE, EXIT_USAGE


class UsageError(Exception):
    """Bad input: printed as one line, exit status 2, nothing launched. `where` (a file and key)
    is printed as it is; the message goes through redact_secrets, which would take a key named
    like a secret and the reason's first word (`fixed.password: no model ...`) for a secret."""

    def __init__(self, message: str, where: str = ""):
        super().__init__(where + message)
        self.where, self.message = where, message

    @classmethod
    def of_spec(cls, e) -> UsageError:
        return cls(e.reason, f"{e.path}: {e.key}: ")


def read_yaml(path: Path):
    """A YAML file the user named, or a UsageError in one line naming it (and the line at fault)."""
    from .plan import spec  # noqa: PLC0415 - plan.spec imports trainables, hence torch

    try:
        return spec.read_yaml(path)
    except spec.SpecError as e:
        raise UsageError.of_spec(e) from None


def load_trial_source(source: str) -> tuple[dict, str | None]:
    """A YAML trial config file (e.g. written by `orchestrator best`), or a preset 'task/model';
    with the hash of the data its trial ran on, where the file records it (a best file does)."""
    # trainables imports torch (seconds): only `train` needs it
    from trainables.config import ConfigError, preset  # noqa: PLC0415
    from trainables.models import is_file_model  # noqa: PLC0415

    path = Path(source)
    if path.suffix in (".yaml", ".yml") or path.exists():
        data = read_yaml(path)
        if not isinstance(data, dict):
            raise UsageError(f"{source}: expected a mapping of trial config keys")
        return data.get("config", data), data.get("data_hash") if "config" in data else None
    if "/" not in source:
        raise UsageError(f"{source}: neither a YAML file nor a preset 'task/model' (e.g. ctl/ndr)")
    task, model = source.split("/", 1)
    if is_file_model(model):  # a model of one's own has no paper's setting: the training defaults
        return {"task": task, "model": model}, None
    try:
        return preset(task, model), None
    except ConfigError as e:
        raise UsageError(str(e)) from None


def port_number(text: str) -> int:
    """argparse's type for a TCP port: its error is the one line argparse prints."""
    port = int(text)  # argparse turns a ValueError into "invalid port_number value"
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a port (0-65535)")
    return port


def ui_url(text: str) -> str:
    """argparse's type for `--mlflow-url`: an http(s) address; its error is the one line argparse prints."""
    parts = urllib.parse.urlsplit(text)
    try:
        parts.port  # raises where the port is no number or out of range
        good = parts.scheme in ("http", "https") and parts.hostname and not (parts.query or parts.fragment)
    except ValueError:
        good = False
    if not good:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not the http(s) address of MLflow's UI, e.g. {DEFAULT_URL}"
        )
    return text.rstrip("/")


def say_what_differs(recorded: dict, flat: dict) -> None:
    """A line where `--set` changes what a launch's trial ran (a best file's config): its metric then
    does not re-run to the number in the file's header, threads and seed included."""
    changes = [
        f"{key} {recorded.get(key)!r} -> {flat.get(key)!r}"
        for key in sorted(set(recorded) | set(flat))
        if recorded.get(key) != flat.get(key)
    ]
    if changes:
        print(
            f"[train] --set changes the launch's trial ({', '.join(changes)}): the metric does not "
            "re-run to the file's number",
            flush=True,
        )


def cmd_train(args) -> int:
    from trainables.config import (  # noqa: PLC0415 - trainables imports torch: only `train` needs it
        ConfigError,
        check_builds,
        parameter_count,
        parse_trial_config,
        set_override,
    )

    flat, launch_data = load_trial_source(args.source)
    recorded = copy.deepcopy(flat)
    try:
        for assignment in args.set or []:
            set_override(flat, assignment)
        cfg = parse_trial_config(flat)
    except ConfigError as e:
        raise UsageError(f"{args.source}: {e}") from None
    try:
        check_builds(cfg)  # the same check a launch's space gets
    except ConfigError as e:
        raise UsageError(
            f"{args.source}: model {cfg.model} with its options {cfg.model_options}: {e}"
        ) from None
    from trainables.tasks import eval_sizes  # noqa: PLC0415 - as above: torch, for `train` only
    from trainables.train import pick_device, train  # noqa: PLC0415 - as above: torch, for `train` only

    try:
        device = pick_device(cfg.device)
    except ConfigError as e:
        raise UsageError(f"{args.source}: {e}") from None
    params, sizes = parameter_count(cfg), eval_sizes(cfg.task, cfg.task_options)
    print(
        training_cost(
            cfg.model, cfg.task, device.type, params, cfg.batch_size, cfg.n_iters, cfg.eval_every, sizes
        ),
        flush=True,
    )
    if launch_data:
        say_what_differs(recorded, flat)
    metrics = train(cfg)
    if launch_data and metrics["data_hash"] != launch_data:
        print(
            f"[train] the data differ from the launch's (data_hash {launch_data} there, "
            f"{metrics['data_hash']} here): the metric does not re-run to the file's number",
            flush=True,
        )
    # The final metrics as JSON (other tools read it), rounded to what a reader compares; a diverged
    # run's NaN loss and missing best are null (JSON has no NaN: jq and others refuse Python's).
    print(
        json.dumps(
            {
                k: (round(v, 4) if math.isfinite(v) else None) if isinstance(v, float) else v
                for k, v in metrics.items()
            },
            indent=2,
            sort_keys=True,
            allow_nan=False,
        )
    )
    return 0 if metrics["status"] == "completed" else 1


def validated(
    spec_file: str, tracking_uri: str | None = None, storage: str | None = None, text: str | None = None
):
    """The Study of `spec_file` (or of `text`, read as that file), with `tracking_uri` and `storage`
    overriding the file's, and its text, with the tracking store reachable; UsageError otherwise."""
    from .plan.spec import SpecError, load_study  # noqa: PLC0415 - imports trainables, hence torch

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


# What an HTTP/2 client sends first: the preface and an empty SETTINGS frame (RFC 9113, 3.4).
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])


def read_at_most(conn: socket.socket, size: int) -> bytes:
    """Up to `size` bytes, fewer where the peer closes the connection first."""
    got = b""
    while len(got) < size:
        chunk = conn.recv(size - len(got))
        if not chunk:
            break
        got += chunk
    return got


def check_address(address: str | None, timeout_s: float = 5.0) -> None:
    """A HOST:PORT cluster must answer as Ray's GCS does, within seconds (Ray itself retries for
    minutes, deaf to SIGTERM), and this machine must be one of its nodes: Ray connects a driver
    through a raylet of its own machine, and without one gives up after a minute with a
    ConnectionError (a Kubernetes pod, a laptop). The GCS is a gRPC server: it answers HTTP/2's
    preface with a SETTINGS frame at once (RFC 9113, 3.4); a silent port kept ray.init waiting past
    300 s, and Redis on Ray's old default port 6379 answers "-ERR unknown command"."""
    if not address or address in ("auto", "local") or "://" in address:
        return
    host, _, port = address.rpartition(":")
    try:
        conn = socket.create_connection((host.strip("[]") or "127.0.0.1", int(port)), timeout=timeout_s)
    except (OSError, ValueError) as e:
        raise UsageError(
            f"--address: no Ray cluster answers at {address} within {timeout_s:.0f} s ({e})"
        ) from None
    with conn:
        try:
            conn.sendall(HTTP2_PREFACE)
            header = read_at_most(conn, 9)  # a frame's header: length (3), type (1), flags, stream
        except TimeoutError:
            raise UsageError(
                f"--address: {address} accepted a connection but sent nothing back within {timeout_s:.0f} s: "
                "no Ray cluster answers there"
            ) from None
        except OSError as e:
            raise UsageError(
                f"--address: {address} is not a Ray cluster's head: it reset the connection "
                f"({e.strerror or e})"
            ) from None
        if len(header) == 9 and header[3] == 4:  # 4: SETTINGS
            return check_ray_node(address)
        with contextlib.suppress(OSError):  # the rest of its first line, to name what answers
            conn.settimeout(0.5)
            header += conn.recv(64)
    found = header.splitlines()[0][:60] if header.strip() else b""
    raise UsageError(
        f"--address: {address} is not a Ray cluster's head: "
        + (f"it answered {found!r}" if found else "it closed the connection, saying nothing")
    )


def check_ray_node(address: str) -> None:
    """This machine runs a raylet of the cluster at `address` (a driver connects through one)."""
    # The raylets running here, as ray.init looks for them; ray takes seconds to import: a launch only.
    from ray._private.services import find_node_ids  # noqa: PLC0415

    if not find_node_ids():
        raise UsageError(
            f"--address: this machine is not a node of the Ray cluster at {address}, and a driver runs on "
            f"one: join it first with `ray start --address {address} --num-cpus=0` (trials never run there; "
            "deploy/README.md)"
        )


def check_writable(folder: Path, where: str) -> None:
    problem = unwritable(folder)
    if problem:
        raise UsageError(f"{where}: cannot create launch folders in {folder} ({problem})")


NIGHTLY_KEYS = {"ablations", "budget"}


def nightly_files(path: str) -> list[tuple[str, str | None]]:
    """(file, text) of each ablation a nightly run covers: FILE itself (text None: read as is), or
    the files FILE lists under `ablations` (relative to FILE's folder), each with FILE's `budget`
    over its own."""
    from .plan.spec import Report, SpecError, parse_budget  # noqa: PLC0415 - imports trainables, hence torch

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


def cmd_launch(args) -> int:
    """`launch FILE`, or `nightly FILE`: each ablation FILE covers, as tonight's night of its own."""
    from .plan.spec import name_problem  # noqa: PLC0415 - imports trainables, hence torch
    from .run import launch  # noqa: PLC0415 - imports Ray (seconds): the commands that launch only

    if args.launch_id and name_problem(args.launch_id):
        raise UsageError(f"--launch-id: {name_problem(args.launch_id)}")  # it names a folder under storage
    plans = checked_plans(args)
    check_address(args.address)
    codes = {0}
    for study, text, night in plans:
        print_plan(study, night)
        if args.dry_run:
            print_cost(study, args)
            continue
        try:
            code = launch.start(study, text, args.launch_id, args.address, night)
        except StorageError as e:
            raise UsageError(f"{'--storage' if args.storage else study.path}: {e}") from None
        except launch.ClusterMismatch as e:
            raise UsageError(f"{study.path}: {e}") from None
        except launch.LaunchExists as e:
            raise UsageError(f"--launch-id: {e}") from None
        if code not in (0, launch.EXIT_REGRESSION, launch.EXIT_TRIALS_FAILED):
            return code  # interrupted or failed: the nights after it wait for `resume`
        codes.add(code)
    if args.command == "nightly" and not args.dry_run:
        refresh_board(Path(plans[0][0].storage_path))
    return launch.EXIT_REGRESSION if launch.EXIT_REGRESSION in codes else max(codes)  # a regression says most


def refresh_board(storage: Path) -> None:
    """Each night ends with the reproduction board over every finished launch beside it."""
    from .report import board  # noqa: PLC0415 - pandas, scipy and the presets (torch): seconds

    paths, context = board.write(storage)
    print(f"[nightly] the reproduction board ({board.counts(context)}): {paths[1]}", flush=True)


def checked_plans(args) -> list[tuple]:
    """(study, text, night) of each file the command launches (night: None but for `nightly`),
    every one validated before anything launches."""
    nightly = args.command == "nightly"
    plans = []
    for file, text in nightly_files(args.file) if nightly else [(args.file, None)]:
        study, text = validated(file, args.tracking_uri, args.storage, text)
        args.store_uri = study.tracking.uri
        check_launchable(args, file, study, nightly)
        night = nights_so_far(Path(study.storage_path), study.experiment, file) if nightly else None
        plans.append((study, text, night))
    if nightly and args.launch_id and len(plans) > 1:
        raise UsageError(f"--launch-id: {args.file} runs {len(plans)} ablations; each names its own night")
    return plans


def check_launchable(args, file: str, study, nightly: bool) -> None:
    """What a launch of `study` (from `file`) needs beyond a valid file: an ablation for `nightly`,
    folders it can write, and a --launch-id no launch has taken."""
    if nightly and not study.is_ablation:
        raise UsageError(
            f"{file}: grid: the nightly job runs ablations (a grid or seeds); this file is a search"
        )
    check_writable(Path(study.storage_path), f"{file}: storage_path")
    if not study.storage.is_object_store:
        # A dry run checks it here; a launch also on every node (launch.check_storage).
        problem = unwritable(Path(study.storage.uri).expanduser())
        if problem:
            raise UsageError(
                f"{'--storage' if args.storage else f'{file}: storage'}: cannot write trial storage in "
                f"{study.storage.uri} ({problem})"
            )
    if args.launch_id and (Path(study.storage_path) / args.launch_id / "launch.json").exists():
        raise UsageError(
            f"--launch-id: launch {args.launch_id} exists in {study.storage_path}; "
            f"`orchestrator resume {args.launch_id}` goes on with it, another id starts a new one"
        )


def print_plan(study, night: int | None) -> None:
    """The plan of a launch, and for a night of the nightly job its seeds and its baseline."""
    print(describe_study(study), flush=True)
    if night is not None:
        compared = (
            "the first night: nothing to compare with yet; the nights after it compare with it"
            if night == 0
            else "compared with the last finished night that flagged no regression "
            f"({study.report.test}, alpha {study.report.alpha:g})"
        )
        print(
            f"  night {night + 1} of {study.experiment}: seeds + {night * SEED_STRIDE}; {compared}",
            flush=True,
        )


def print_cost(study, args) -> None:
    """`--dry-run`'s estimate of what the launch of `study` will cost, a line at a time."""
    from .run.cost import describe_cost, on_cluster  # noqa: PLC0415 - imports trainables, hence torch

    if args.calibrate:
        where = f", on nodes of the cluster at {args.address}" if on_cluster(args.address) else ""
        print(
            "  calibrating: a few training steps of each pair's typical trial "
            f"({len(study.pairs)} pairs){where}",
            flush=True,
        )
    for line in describe_cost(study, args.calibrate, args.address):
        print(line, flush=True)


def nights_so_far(storage_path: Path, experiment: str, file: str) -> int:
    """How many nights of the nightly job the launches under `storage_path` hold for `file` (by its
    name, state.same_file) in `experiment`."""
    states = readable_launches(storage_path)
    return sum(
        1
        for s in states
        if s.experiment == experiment and s.night is not None and Path(s.spec_file).name == Path(file).name
    )


def cmd_resume(args) -> int:
    # Optuna and Ray take seconds to import: of the commands that read a launch, only resume needs them
    from .record.optuna_store import search_store  # noqa: PLC0415
    from .run import launch  # noqa: PLC0415

    state = load_state(args, writes_store=True)
    if state.snapshot_modules != SNAPSHOT_MODULES:  # Tune could not unpickle its own snapshot
        raise UsageError(
            f"{state.dir / 'launch.json'}: snapshot_modules: {state.snapshot_modules}, this service reads "
            f"{SNAPSHOT_MODULES}: Tune's "
            "snapshot of the launch names the modules of the service that began it (1: before the split into "
            "plan/run/record/report, commit 1f0f7de); resume it with that service, or launch the file again "
            "(its MLflow runs stay where they are)"
        )
    alive, where = driver(state.dir)
    if alive:
        raise UsageError(
            f"{state.dir}: a driver is running this launch now ({where}); `orchestrator status {state.dir}` "
            "shows its progress"
        )
    if state.moved_from and (
        state.recorded["tracking_uri"],
        state.recorded["storage"],
        search_store(state.recorded["tracking_uri"], state.moved_from, create=False)[0],
    ) != (state.tracking_uri, state.storage, search_store(state.tracking_uri, state.dir, create=False)[0]):
        # Tune restored the trials of a moved launch with their old storage, and each failed for good
        raise UsageError(
            f"{state.dir}: moved here from {state.moved_from} with its store or checkpoints; Tune's "
            "snapshot names their old places, so it resumes only there: move it back to resume it "
            "(status, report, best and export read it here)"
        )
    if wrong := misplaced(state.dir):
        raise UsageError(f"{wrong}: a launch's folders and files are the service's to write")
    # Read before Ray starts: the file as launched (DamagedLaunch where it no longer loads), its
    # storage, and its store's records (a damaged database says so).
    storage, study = state.trial_storage(), state.study()
    launch_trial_runs(state.tracking_uri, state.experiment, state.launch_id)
    if edits := state.edits():
        shown = "; ".join(edits[:4]) + (f"; and {len(edits) - 4} more" if len(edits) > 4 else "")
        print(
            f"[resume] {state.spec_file} changed since {state.launch_id} began ({shown}): the launch goes on "
            "with the plan it began with (launch.json); launch the file again to run the new one",
            flush=True,
        )
    check_address(args.address)
    launch.start_ray(args.address)
    try:
        launch.check_storage(storage, "storage")
    except StorageError as e:
        raise UsageError(f"{state.dir / 'launch.json'}: {e}") from None
    return launch.execute(state, args.address, study)


def load_state(args, uses_store: bool = True, writes_store: bool = False):
    """The launch `args` name, its tracking store checked: it answers and holds MLflow's tables,
    and with `writes_store` (`resume`) a SQLite file is writable too; with `uses_store` False
    (`accept`, which only writes launch.json) neither checked nor its password asked for."""
    try:
        state = LaunchState.load(find_launch(args.storage_path, args.launch))
    except FileNotFoundError as e:
        raise UsageError(str(e)) from None
    if not uses_store:
        return state
    args.store_uri = state.tracking_uri
    database = missing_sqlite_file(state.tracking_uri)
    if database:  # opening it would make an empty store and show no trials
        moved = (
            f", nor at {state.here(Path(database))}, where the launch folder's move from "
            f"{state.moved_from} puts it"
            if state.moved_from
            else ""
        )
        raise UsageError(
            f"{state.dir / 'launch.json'}: tracking_uri: no SQLite store at {database} from "
            f"{Path.cwd()}{moved} "
            "(run where the launch ran, or copy its database there)"
        )
    try:  # one line where a server or database cannot answer, not its client's traceback (the
        # SQLite file is there: it may be only readable to this user, which check_store refuses);
        # check_store reveals the password as it connects, and a command that does not connect still needs it
        sqlite = state.tracking_uri.startswith("sqlite:")
        if sqlite:
            reveal(state.tracking_uri)
        else:
            check_store(state.tracking_uri)
        if not store_exists(state.tracking_uri):  # reading it through MLflow would write its tables into it
            raise TrackingError(
                f"{redact(state.tracking_uri)} holds no MLflow store (an empty file, or another program's "
                "database)"
            )
        if sqlite and writes_store:  # a read needs the file readable only
            check_store(state.tracking_uri)
    except TrackingError as e:
        raise UsageError(f"{state.dir / 'launch.json'}: tracking_uri: {e}") from None
    return state


def cmd_status(args) -> int:
    """From launch.json and the tracking store only: no Ray, no spec parsing, no torch."""
    state = load_state(args)
    plan = state.the_plan()
    # Asked once: a driver that stops between two asks made the header and the table disagree.
    driver_now = driver(state.dir)
    print(f"launch {state.launch_id} ({state.dir}): {describe(state, driver_now)}")
    print(f"{plan['metric']}, {plan['mode']}")
    # Runs the driver left running when it stopped (Ctrl-C, killed) run no more: `resume` continues them.
    running = "running" if driver_now[0] else "unfinished"
    for line in launch_table(state, plan, running):
        print(line)
    if running == "unfinished" and state.state != "finished":
        print(
            f"('unfinished': running when the driver stopped; `orchestrator resume {state.dir}` continues "
            "them)"
        )
    return 0


def cmd_accept(args) -> int:
    """A night's regression was intended (a new protocol, a fixed bug that inflated scores): later
    nights compare with this night instead of the last one before it."""
    state = load_state(args, uses_store=False)
    if state.night is None:
        raise UsageError(
            f"accept: launch {state.launch_id} is no night of the nightly job; nights compare with nights"
        )
    if not state.regressed:
        raise UsageError(f"accept: night {state.launch_id} flagged no regression; it is already a baseline")
    state.accepted = True
    state.save()
    print(f"accepted night {state.launch_id}'s regression: the nights after it compare with it")
    return 0


def cmd_best(args) -> int:
    """From launch.json and the tracking store only, as `status`."""
    state = load_state(args)
    if state.the_plan()["ablation"]:  # its best seed across cells is chosen on noise
        raise UsageError(
            f"best: launch {state.launch_id} is an ablation, whose answer is per cell over seeds: "
            f"orchestrator status {state.launch_id} or orchestrator report {state.launch_id}"
        )
    if args.ablation:  # refused before anything is written
        try:
            studies = searched_and_ablation(state, Path(args.ablation))
        except ValueError as e:
            raise UsageError(f"best: {e}") from None
    summaries = summaries_of(state)  # the store read once, for both files
    written = write_best(state, summaries)
    for path in written:
        print(path)
    answered = {path.stem for path in written}
    for pair in [p["name"] for p in state.the_plan()["pairs"] if p["name"] not in answered]:
        s = summaries.get(pair, {})
        print(
            f"no best config for {pair}: none of its trials completed ({failed_text(s)}; "
            f"{s.get('stopped', 0)} stopped early)"
        )
    if args.ablation:
        try:
            path, lines = write_ablation(state, Path(args.ablation), summaries, studies)
        except ValueError as e:
            raise UsageError(f"best: {e}") from None
        for line in lines:
            print(f"  {line}")
        print(path)
    return 0


def cmd_report(args) -> int:
    from .report.report import (  # noqa: PLC0415 - Optuna and pandas: seconds
        verdict_lines,
        write_launch_report,
        write_report,
    )

    state = load_state(args)
    if args.compare and not state.study().is_ablation:
        raise UsageError(
            f"--compare: launch {state.launch_id} is a search; launches compare cell by cell only as "
            "ablations"
        )
    previous = None
    if args.compare == "previous":
        previous = previous_launch(state)
        if previous is None:
            raise UsageError(
                f"--compare previous: no finished launch of {Path(state.spec_file).name} in "
                f"{state.experiment} under {state.dir.parent} before {state.launch_id}; "
                "nothing to compare with"
            )
    elif args.compare:
        previous = load_state(argparse.Namespace(storage_path=args.storage_path, launch=args.compare))
        # A search, or a launch of other pairs, shares no cell: its verdict was "no regression in 0
        # cells", exit 0.
        theirs = previous.the_plan()
        if not theirs["ablation"]:
            raise UsageError(
                f"--compare: launch {previous.launch_id} is a search; launches compare cell by cell only "
                "as ablations"
            )
        if not {p["name"] for p in theirs["pairs"]} & {p["name"] for p in state.the_plan()["pairs"]}:
            raise UsageError(
                f"--compare: launch {previous.launch_id} ({previous.spec_file}) has no model/task pair of "
                f"{state.launch_id} "
                f"({state.spec_file}); nothing to compare"
            )
    paths, regressions = (
        write_report(state, previous, ui_url=args.mlflow_url)
        if previous
        else write_launch_report(state, args.mlflow_url)
    )
    for path in paths:
        print(path)
    for line in verdict_lines(regressions):
        print(line)
    return 1 if regressions else 0


def cmd_export(args) -> int:
    """From launch.json and the tracking store only, as `status`."""
    from .record.export import FORMATS, launch_frame, write_frame  # noqa: PLC0415 - pandas takes a second

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


def cmd_ui(args) -> int:
    """MLflow's UI (`mlflow server`, one worker) on the launch's store until Ctrl-C or SIGTERM, and
    the links into it with its address; a tracking server is its own UI: its links only."""
    state = load_state(args)
    if state.tracking_uri.startswith(("http://", "https://")):
        for line in launch_lines(state, redact(state.tracking_uri)):
            print(line)
        return 0
    try:
        port = free_port(args.port)
    except OSError as e:
        raise UsageError(f"--port: cannot listen on 127.0.0.1:{args.port} ({e.strerror or e})") from None
    try:
        with Server(state.tracking_uri, port) as server:
            print(f"MLflow's UI on {redact(state.tracking_uri)}: starting at {server.address}", flush=True)
            lines = launch_lines(state, server.address)  # MLflow's and torch's imports while it starts
            server.wait_until_it_answers()
            for line in lines:
                print(line)
            if server.address != DEFAULT_URL:
                print(
                    f"(the report's links point at {DEFAULT_URL}: `orchestrator report {state.dir} "
                    f"--mlflow-url {server.address}` points them here)"
                )
            print("Ctrl-C stops it", flush=True)
            server.process.wait()
            raise TrackingError(server.why_stopped())
    except KeyboardInterrupt:
        print("MLflow's UI stopped")
        return 0
    except TrackingError as e:
        raise UsageError(f"ui: {e}") from None


def cmd_dashboard(args) -> int:
    """optuna-dashboard (an optional extra) on the Optuna storage of a search launch."""
    try:
        import optuna_dashboard  # noqa: PLC0415 - an optional extra: only this command asks for it
    except ImportError:
        raise UsageError(
            "dashboard: optuna-dashboard is not installed; pip install -e '.[dashboard]'"
        ) from None
    from .record.optuna_store import read_only_view, search_storage  # noqa: PLC0415 - Optuna: seconds

    state = load_state(args)
    plan = state.the_plan()
    if plan["ablation"]:
        raise UsageError(
            f"dashboard: launch {state.launch_id} is an ablation, whose grid runs without Optuna; "
            "`orchestrator report` or `orchestrator export` show its runs"
        )
    names = {state.optuna_study_name(pair["name"]) for pair in plan["pairs"]}
    try:
        storage = read_only_view(search_storage(state.tracking_uri, state.dir, read_only=True), names)
    except TrackingError as e:
        raise UsageError(f"dashboard: {e}") from None
    print(f"the Optuna studies of launch {state.launch_id}, one per pair:")
    for pair in plan["pairs"]:
        print(f"  {state.optuna_study_name(pair['name'])}")
    sys.stdout.flush()  # before the dashboard's own lines (where it listens, how to quit) on stderr
    try:
        optuna_dashboard.run_server(storage, host=args.host, port=args.port)
    except OSError as e:  # the port is taken, or the host is not one of this machine's addresses
        raise UsageError(f"--port: cannot listen on {args.host}:{args.port} ({e.strerror or e})") from None
    return 0


def cmd_list(args) -> int:
    """What a researcher can name in a file or on the command line, without importing Ray."""
    # trainables imports torch (seconds): `list launches` reads launch.json only
    from trainables.config import preset_models  # noqa: PLC0415
    from trainables.kinds import KINDS  # noqa: PLC0415
    from trainables.models import MODELS  # noqa: PLC0415
    from trainables.tasks import TASKS  # noqa: PLC0415

    if args.what == "tasks":
        kind_width = max(len(spec.kind.name) for spec in TASKS.values())
        scores_width = max(len("/".join(kind.scores)) for kind in KINDS.values())
        for name, spec in TASKS.items():
            options = ", ".join(f.name for f in dataclasses.fields(spec.config))
            print(
                f"{name:22s} {spec.kind.name:{kind_width}s} "
                f"scores {'/'.join(spec.kind.scores):{scores_width}s} options: {options}"
            )
    elif args.what == "models":
        for name, spec in MODELS.items():
            print(f"{name:24s} {', '.join(map(str, spec.kinds)):42s} {spec.description}")
    elif args.what == "presets":
        for task, models in preset_models().items():
            print(f"{task:22s} " + " ".join(f"{task}/{model}" for model in models))
    else:
        folders = sorted(
            Path(args.storage_path).glob("*/launch.json"), key=started_at
        )  # as `status` finds the last one
        if not folders:
            print(f"no launches in {args.storage_path}/")
        for path in folders:
            try:
                state = LaunchState.load(path.parent)
            except DamagedLaunch as e:
                print(f"{path.parent.name:48s} {'damaged':12s} {e}")
                continue
            alive, _ = driver(path.parent)
            shown = "running" if alive else ("driver gone" if state.state == "running" else state.state)
            # A night's verdict: which night `orchestrator accept` could take.
            verdict = {
                None: "",
                False: "  (no regression)",
                True: "  (regressed, accepted)" if state.accepted else "  (regressed)",
            }[state.regressed]
            if state.night is not None and state.state == "finished" and state.regressed is None:
                verdict = "  (no earlier night to compare with)"
            print(f"{state.launch_id:48s} {shown:12s} {state.experiment:28s} {state.spec_file}{verdict}")
    return 0


def own_resources(study, pair) -> str:
    """A pair's trial resources in words for the plan, where per_model sets them ("" for the file's)."""
    if pair.resources == study.resources:
        return ""
    gpu = f", {pair.resources.gpu:g} GPU" if pair.resources.gpu else ""
    return f"; each trial {pair.resources.cpu:g} CPU{gpu}" + "".join(
        f", {v:g} {k}" for k, v in pair.resources.custom.items() if v
    )


def own_values(pair) -> str:
    """A pair's per_pair values in words for the plan ("" where it has none)."""
    return (
        "; its own values (per_pair): " + ", ".join(f"{k}={v}" for k, v in pair.own_values.items())
        if pair.own_values
        else ""
    )


def training_lines(study) -> list[str]:
    """Per pair, the protocol keys its paper's preset gives it and those at the training defaults
    (the file's fixed, space and grid aside); per task variant whose models differ in them, a line
    saying so (a model without a preset beside the papers' baselines)."""
    from trainables.config import yaml_word  # noqa: PLC0415 - trainables imports torch: a launch only
    from trainables.models import label  # noqa: PLC0415 - as above

    def listed(values: dict) -> str:
        return ", ".join(f"{k}={yaml_word(v)}" for k, v in values.items()) or "none"

    def by_value(models: dict) -> str:
        grouped: dict[str, list[str]] = {}
        for model, value in models.items():
            grouped.setdefault(yaml_word(value), []).append(label(model))
        return ", ".join(f"{value} ({', '.join(names)})" for value, names in grouped.items())

    lines = [
        f"  training of {p.name}: from its paper's preset: {listed(p.from_preset)}; "
        f"at the training defaults: {listed(p.from_defaults)}"
        for p in study.pairs
    ]
    for variant in dict.fromkeys(p.task.variant for p in study.pairs):
        if unlike := study.unlike_training(variant):
            differences = "; ".join(
                f"{key} {by_value(fallen)} at the defaults, {by_value(papers)} from their papers"
                for key, (papers, fallen) in unlike.items()
            )
            lines.append(f"  {variant}: its models train unlike: {differences} (`fixed:` sets one for all)")
    return lines


def unstopped(study, pair) -> str:
    """Where ASHA could stop none of a search pair's trials (they end by its first rung), in words
    for the plan ("" otherwise): the file asks for early stopping that would never happen."""
    n_iters = int(pair.base["n_iters"])
    if not study.uses_asha or n_iters > study.scheduler.grace_period:
        return ""
    return (
        f"; ASHA stops none of its trials: they end at {n_iters} iterations, within "
        f"scheduler.grace_period {study.scheduler.grace_period}"
    )


def describe_study(study) -> str:
    from .run.stacking import decide  # noqa: PLC0415 - imports trainables, hence torch: a launch only

    stacking = decide(study, use_gpu=None)  # printed before the launch knows whether trials get GPUs
    if study.is_ablation:
        cells = [math.prod(len(v) for v in p.grid.values()) for p in study.pairs]
        lines = [
            f"{study.path}: ablation of {len(study.pairs)} model/task pairs, {sum(cells)} grid cells in "
            f"all x {len(study.seeds)} seeds, "
            f"{study.budget.max_concurrent} at a time per pair; MLflow {redact(study.tracking.uri)}"
        ]
        lines += [
            f"  pair {p.name}: grid over {', '.join(p.grid) or 'seeds only'} ({n} cells; "
            f"{stacking.seed_batching(p)}){own_resources(study, p)}{own_values(p)}"
            for p, n in zip(study.pairs, cells)
        ]
    else:
        lines = [
            f"{study.path}: {len(study.pairs)} model/task pairs x {study.budget.trials} trials, "
            f"{study.budget.max_concurrent} at a time per pair; optimising {study.metric} ({study.mode}); "
            f"MLflow {redact(study.tracking.uri)}"
        ]
        lines += [
            f"  pair {p.name}: searching {', '.join(p.space) or 'nothing'}{stacking.search_stacking(p)}"
            f"{unstopped(study, p)}{own_resources(study, p)}{own_values(p)}"
            for p in study.pairs
        ]
        if study.confirm.top_k:
            lines.append(
                f"  then confirming: each pair's {study.confirm.top_k} best trials again with seeds "
                f"{', '.join(map(str, study.confirm.seeds))}; "
                "the pair's answer is the best candidate's mean"
            )
    lines += training_lines(study)
    lines.append(
        f"  trial checkpoints in {study.storage.uri}; a trial restarts up to {study.budget.max_failures} "
        "times from its last one"
    )
    lines += [f"  skipped (incompatible): {s}" for s in study.skipped]
    lines += [f"  unused: {u}" for u in study.unused]
    return "\n".join(lines)


ADDRESS = {
    "default": os.environ.get("RAY_ADDRESS"),
    "help": "join this Ray cluster, HOST:PORT or auto (default: $RAY_ADDRESS, else start a new local "
    "instance)",
}


class OneLineParser(argparse.ArgumentParser):
    """Bad arguments get one line and exit status 2, as bad files do (argparse prints its usage first)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (`{self.prog} --help` says more)\n")


def build_parser() -> argparse.ArgumentParser:
    return parser_and_commands()[0]


def cmd_board(args) -> int:
    """The reproduction board over the finished launches under --storage-path (report/board.py)."""
    from .report import board  # noqa: PLC0415 - pandas, scipy and the presets (torch): seconds

    storage = Path(args.storage_path)
    if not storage.is_dir():
        raise UsageError(f"--storage-path: no such folder {storage}")
    if args.tracking_uri and redact(args.tracking_uri) != args.tracking_uri:
        raise UsageError(
            "--tracking-uri: holds a password, which `ps` shows every user of this machine; set "
            "MLFLOW_TRACKING_URI to this URI instead"
        )
    uri = args.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    args.store_uri = uri
    uri, output = uri and normalize_store(uri), Path(args.output) if args.output else None
    docs = None
    if args.docs:
        problem = board.docs_problem(Path(args.docs))
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


def add_board_command(sub) -> None:
    text = (
        "the reproduction board: each claim of the three papers with the best evidence of every finished "
        "launch under --storage-path and a verdict (reproduced, ordering shown, not shown at this scale, "
        "not reproduced at the paper's scale, contradicted, not run), as Markdown and HTML, logged to MLflow"
    )
    p = sub.add_parser("board", help=text, description=text)
    p.add_argument("--storage-path", default="runs", help="where launches live (default: runs)")
    p.add_argument(
        "--tracking-uri",
        help="only the launches tracked in this store, where the board is logged too (default: every "
        "launch; logged in the newest launch's store)",
    )
    p.add_argument("--output", help="the folder to write (default: <storage-path>/board)")
    p.add_argument(
        "--no-links",
        action="store_true",
        help="the Markdown names each launch without linking its report and runs: for a page kept elsewhere",
    )
    p.add_argument(
        "--docs",
        metavar="PAGE",
        help="also write the board, without links, after a table of facts (machine, commits, dates, "
        "launches) between the page's board:begin and board:end markers (docs/results.md); a new "
        "page where PAGE does not exist",
    )
    p.add_argument(
        "--mlflow-url",
        type=ui_url,
        help=f"where the links find MLflow's UI (default: {DEFAULT_URL}, or the tracking server)",
    )
    p.set_defaults(func=cmd_board)


def parser_and_commands() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The parser, and each command's own (the reference page's source: orchestrator.reference)."""
    parser = OneLineParser(prog="orchestrator", description=__doc__)
    parser.add_argument(
        "--version",
        action="version",
        version=f"%(prog)s {importlib.metadata.version('sysgen-search')}",
        help="the installed package's version (pyproject.toml's; docs/changelog.md says what each brought)",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    add_train_command(sub)
    add_launch_commands(sub)
    add_list_command(sub)
    add_launch_readers(sub)
    add_board_command(sub)
    return parser, dict(sub.choices)


def add_train_command(sub) -> None:
    text = "train one trial from a preset (task/model) or a YAML trial config"
    p = sub.add_parser("train", help=text, description=text)
    p.add_argument("source", help="a YAML trial config, or a preset such as ctl/ndr")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a key (repeatable)")
    p.set_defaults(func=cmd_train)


def add_launch_commands(sub) -> None:
    """`launch` and `nightly`: the same options, for a launch of one file or a night of several."""
    for name, text, example in [
        (
            "launch",
            "search every model/task pair of a search-space file (or run an ablation file) on Ray Tune",
            "search_spaces/ctl.yaml",
        ),
        (
            "nightly",
            "run an ablation file (or each ablation a nightly file lists) as tonight's night: new seeds, "
            "a report compared by a test across seeds with the last finished night that flagged no "
            "regression (or whose regression was accepted), dated beside the previous nights' (exit 1 on "
            "a regression)",
            "ablations/ndr_cpu_ctl.yaml",
        ),
    ]:
        p = sub.add_parser(name, help=text, description=text)
        what = (
            "a search-space or ablation YAML"
            if name == "launch"
            else "an ablation YAML, or a nightly file (deploy/nightly.yaml: ablations and a budget)"
        )
        p.add_argument("file", help=f"{what}, e.g. {example}")
        p.add_argument("--address", **ADDRESS)
        p.add_argument("--tracking-uri", help="override the file's tracking.uri")
        p.add_argument(
            "--storage",
            help="override the file's storage: where trial checkpoints live (a folder every node sees, "
            "or s3://bucket/prefix)",
        )
        p.add_argument(
            "--launch-id", help="name the launch (default: <name>-<timestamp>, or <name>-night-<timestamp>)"
        )
        p.add_argument(
            "--dry-run", action="store_true", help="validate and print the plan and its cost; launch nothing"
        )
        p.add_argument(
            "--calibrate",
            action=argparse.BooleanOptionalAction,
            default=False,
            help="with --dry-run: time a few training steps of each pair here (or on the cluster's nodes) "
            "instead of pricing them, in seconds, by the step rates of earlier trials in the tracking "
            "store, else the benchmarks' rates scaled to each pair's size (the default, --no-calibrate)",
        )
        p.set_defaults(func=cmd_launch)


def add_list_command(sub) -> None:
    text = "the tasks, models and presets one can name, or the launches under --storage-path"
    p = sub.add_parser("list", help=text, description=text)
    p.add_argument("what", choices=["tasks", "models", "presets", "launches"])
    p.add_argument("--storage-path", default="runs", help="where launches live (default: runs)")
    p.set_defaults(func=cmd_list)


def add_launch_readers(sub) -> None:
    """The commands on a launch already made: each names one (by id or folder), or takes the last."""
    for name, func, text in [
        ("resume", cmd_resume, "continue a launch whose driver stopped"),
        (
            "status",
            cmd_status,
            "whether the driver is alive; per pair trials done / stopped early / running (unfinished once "
            "the driver is gone) / failed and the best so far (an ablation's per grid cell)",
        ),
        ("best", cmd_best, "write the best config per pair as files `orchestrator train` accepts"),
        (
            "report",
            cmd_report,
            "a launch's report: a search's per pair (best trial, trials, curves, importances, confirmed "
            "candidates), an ablation's per cell statistics over seeds, beside the papers' numbers, plots, "
            "attention maps (exit 1 on a regression vs --compare)",
        ),
        (
            "export",
            cmd_export,
            "a launch's trial runs as one table (CSV or Parquet): tags, config and last metrics, a row per "
            "run",
        ),
        (
            "dashboard",
            cmd_dashboard,
            "optuna-dashboard on a search launch's Optuna studies (pip install -e '.[dashboard]')",
        ),
        (
            "ui",
            cmd_ui,
            "MLflow's UI on the launch's store (one worker, port 5000 where free), and links to its trials "
            "best first, with the metric and the searched values as columns",
        ),
        (
            "accept",
            cmd_accept,
            "a night that regressed on purpose: the nights after it compare with it, not with the last "
            "night before it",
        ),
    ]:
        p = sub.add_parser(name, help=text, description=text)
        p.add_argument("launch", nargs="?", help="launch id or folder (default: the one started last)")
        p.add_argument("--storage-path", default="runs", help="where launches live (default: runs)")
        add_own_options(p, name)
        p.set_defaults(func=func)


def add_own_options(p, name: str) -> None:
    """The options of the launch reader `name` beyond the launch and --storage-path."""
    if name == "resume":
        p.add_argument("--address", **ADDRESS)
    if name == "best":
        p.add_argument(
            "--ablation",
            help="an ablation file: also write it with each pair's winning values (per_pair) to "
            "<launch>/best/<its stem>_tuned.yaml",
        )
    if name == "report":
        p.add_argument(
            "--compare",
            help="another launch (id or folder), or 'previous' for the last finished launch of the same file",
        )
        p.add_argument(
            "--mlflow-url",
            type=ui_url,
            help=f"where the links find MLflow's UI (`orchestrator ui` prints it; default: {DEFAULT_URL}, "
            "or the tracking server)",
        )
    if name == "ui":
        p.add_argument(
            "--port",
            type=port_number,
            help="on 127.0.0.1 (default: 5000 where free, else a free one; 0: a free one)",
        )
    if name == "export":
        # Checked by cmd_export, not by argparse's choices: bad input is one line, exit status 2.
        p.add_argument("--format", help="csv or parquet (default: --output's extension, else csv)")
        p.add_argument("--output", help="the file to write (default: <launch>/export/runs.<format>)")
    if name == "dashboard":
        p.add_argument("--port", type=port_number, default=8080, help="default: 8080")
        p.add_argument(
            "--host",
            default="127.0.0.1",
            help="the address to listen on (default: 127.0.0.1, this machine only)",
        )


def to_devnull(stream) -> None:
    """A stream whose reader has gone, pointed at /dev/null: its later writes and flushes succeed."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), stream.fileno())


class OutlivesItsReader:
    """A console stream that a launch outlives: `orchestrator launch FILE | less`, then q, closed
    the pipe, and the next line's BrokenPipeError (raised in a Tune callback) killed the driver of
    an hours-long launch with its trials RUNNING. Once the reader is gone, the lines go nowhere."""

    def __init__(self, stream, name: str):
        self._stream, self._name = stream, name

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._reader_gone()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._reader_gone()

    def _reader_gone(self) -> None:
        to_devnull(self._stream)  # what the stream still buffers goes there too
        other = sys.stderr if self._name == "stdout" else sys.stdout
        other.write(
            "[launch] the console's reader is gone; the launch goes on: `orchestrator status` shows its "
            "progress\n"
        )
        other.flush()

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        try:
            retry_delays()  # the environment's retry window, refused before anything starts
        except ValueError as e:
            raise UsageError(str(e)) from None
        return args.func(args)
    except (
        UsageError,
        DamagedLaunch,
        ClusterUnreachable,
    ) as e:  # a message may echo a bad value, secrets and all
        where, message = (e.where, e.message) if isinstance(e, UsageError) else ("", str(e))
        print(f"orchestrator: error: {where}{redact_secrets(message)}", file=sys.stderr)
        return EXIT_USAGE
    except (
        FileExistsError,
        NotADirectoryError,
        IsADirectoryError,
    ) as e:  # a launch folder's report/ or best/ made a file
        print(
            f"orchestrator: error: {e.filename}: {e.strerror}: a launch's folders and files are the "
            "service's to write",
            file=sys.stderr,
        )
        return EXIT_USAGE
    except StoreUnavailable as e:  # before a launch is registered (launch.execute says how to resume one)
        print(
            f"orchestrator: error: {redact_secrets(str(e))}; nothing was started: run the command again "
            "once the store answers",
            file=sys.stderr,
        )
        return EXIT_STORE_UNREACHABLE
    except BrokenPipeError:  # `orchestrator status | head -1`: the reader has what it wanted
        to_devnull(sys.stdout)  # so the exit's flush fails no more
        return EXIT_READER_GONE
    except KeyboardInterrupt:  # before a launch is registered (launch.execute records one stopped later)
        print("orchestrator: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as e:  # last: an error of its own kind above is not re-raised from here
        damage = damaged_store(e)
        if damage is None:
            raise
        store = getattr(args, "store_uri", None)  # the store the command opened: load_state and launch say
        print(
            f"orchestrator: error: {redact_secrets(store) + ': ' if store else ''}the tracking store's "
            f"database is damaged: {damage}",
            file=sys.stderr,
        )
        return EXIT_USAGE


def redeliver_lost_interrupts() -> None:
    """A Ctrl-C whose KeyboardInterrupt the signal handler raises while the main thread runs a
    weakref callback or a __del__ (the garbage collector calls them anywhere) is lost: Python prints
    "Exception ignored in ..." and the command goes on (a chaos soak saw a launch finish after its
    Ctrl-C). Such an interrupt is delivered again, once the main thread has left that callback."""
    default_hook = sys.unraisablehook

    def hook(unraisable) -> None:
        if unraisable.exc_type is not None and issubclass(unraisable.exc_type, KeyboardInterrupt):
            threading.Timer(0.05, signal.raise_signal, (signal.SIGINT,)).start()
        else:
            default_hook(unraisable)

    sys.unraisablehook = hook


def redact_tracebacks() -> None:
    """A traceback (a defect, or a library's error this command does not expect) printed without
    the secrets its messages may hold: a store's error names its URI, password and all."""

    def hook(kind, value, tb) -> None:
        sys.stderr.write(redact_secrets("".join(traceback.format_exception(kind, value, tb))))

    sys.excepthook = hook


def console() -> None:
    """The command as a shell runs it. Once main has answered, a Ctrl-C has nothing left to stop,
    and one pressed while the interpreter exits (Ray's atexit shutdown of its local instance
    sleeps) printed a traceback after our last line: so the exit ignores it."""
    redact_tracebacks()
    redeliver_lost_interrupts()
    # A scheduler (systemd, Kubernetes, a CronJob's deadline) stops a command with SIGTERM: it stops
    # as on Ctrl-C, recording what it leaves resumable (docs/guide/faults.md#stopping).
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    if sys.argv[1:2] in (["launch"], ["nightly"], ["resume"]):
        sys.stdout, sys.stderr = (
            OutlivesItsReader(sys.stdout, "stdout"),
            OutlivesItsReader(sys.stderr, "stderr"),
        )
    code = main()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.exit(code)


if __name__ == "__main__":
    console()
