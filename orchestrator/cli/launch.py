"""`orchestrator launch | nightly | resume`: the commands that start Ray and run trials."""

from __future__ import annotations

from pathlib import Path

from ..plan.nightly import nightly_files
from ..plan.source import SpecError, name_problem
from ..plan.storage import StorageError
from ..record.optuna_store import search_store
from ..record.retries import DiskFull, disk_full
from ..record.runs import launch_trial_runs
from ..record.state import SNAPSHOT_MODULES, driver, misplaced, readable_launches
from ..report import board
from ..run import launch, preflight, ray_start, registry
from ..run.exits import EXIT_REGRESSION, EXIT_TRIALS_FAILED
from .describe import print_cost, print_plan
from .inputs import UsageError, load_state
from .launchable import check_address, check_launchable
from .plans import validated


def cmd_launch(args) -> int:
    """`launch FILE`: the search or ablation FILE asks for."""
    return launch_plans(args, nightly=False)


def cmd_nightly(args) -> int:
    """`nightly FILE`: each ablation FILE covers, as tonight's night of its own."""
    return launch_plans(args, nightly=True)


def launch_plans(args, nightly: bool) -> int:
    """Each file `args` names launched in turn, every one checked before the first starts."""
    if args.launch_id and name_problem(args.launch_id):
        raise UsageError(f"--launch-id: {name_problem(args.launch_id)}")  # it names a folder under storage
    plans = checked_plans(args, nightly)
    check_address(args.address)
    codes = {0}
    for study, text, night in plans:
        print_plan(study, night)
        if args.dry_run:
            print_cost(study, args)
            continue
        try:
            code = launch.Launch.begin(study, text, args.launch_id, args.address, night).run()
        except StorageError as e:
            raise UsageError(f"{'--storage' if args.storage else study.path}: {e}") from None
        except preflight.ClusterMismatch as e:
            raise UsageError(f"{study.path}: {e}") from None
        except registry.LaunchExists as e:
            raise UsageError(f"--launch-id: {e}") from None
        if code not in (0, EXIT_REGRESSION, EXIT_TRIALS_FAILED):
            return code  # interrupted or failed: the nights after it wait for `resume`
        codes.add(code)
    if nightly and not args.dry_run:
        refresh_board(Path(plans[0][0].storage_path))
    return EXIT_REGRESSION if EXIT_REGRESSION in codes else max(codes)  # a regression says most


def refresh_board(storage: Path) -> None:
    """Each night ends with the reproduction board over every finished launch beside it."""
    paths, context = board.write(storage)
    print(f"[nightly] the reproduction board ({board.counts(context)}): {paths[1]}", flush=True)


def checked_plans(args, nightly: bool) -> list[tuple]:
    """(study, text, night) of each file the command launches (night: None but for `nightly`),
    every one validated before anything launches."""
    try:
        files = nightly_files(args.file) if nightly else [(args.file, None)]
    except SpecError as e:
        raise UsageError.of_spec(e) from None
    plans = []
    for file, text in files:
        study, text = validated(file, args.tracking_uri, args.storage, text)
        args.store_uri = study.tracking.uri
        check_launchable(args, file, study, nightly)
        night = nights_so_far(Path(study.storage_path), study.experiment, file) if nightly else None
        plans.append((study, text, night))
    if nightly and args.launch_id and len(plans) > 1:
        raise UsageError(f"--launch-id: {args.file} runs {len(plans)} ablations; each names its own night")
    return plans


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

    state = load_state(args, writes_store=True)
    if state.snapshot_modules != SNAPSHOT_MODULES:  # Tune could not unpickle its own snapshot
        raise UsageError(
            f"{state.dir / 'launch.json'}: snapshot_modules: {state.snapshot_modules}, this service reads "
            f"{SNAPSHOT_MODULES}: Tune's "
            "snapshot of the launch names the modules of the service that began it (1: before the split into "
            "plan/run/record/report, commit 1f0f7de; 2: before 0.3.0, commit 77a76b2); resume it with that "
            "service, or launch the file again "
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
    launch_trial_runs(state.tracked)
    if edits := state.edits():
        shown = "; ".join(edits[:4]) + (f"; and {len(edits) - 4} more" if len(edits) > 4 else "")
        print(
            f"[resume] {state.spec_file} changed since {state.launch_id} began ({shown}): the launch goes on "
            "with the plan it began with (launch.json); launch the file again to run the new one",
            flush=True,
        )
    check_address(args.address)
    ray_start.start_ray(args.address)
    try:
        preflight.check_storage(storage, "storage")
    except StorageError as e:
        if disk_full(e):  # still full: resumable once space is freed, as the launch said
            raise DiskFull(f"{state.dir / 'launch.json'}: {e}") from None
        raise UsageError(f"{state.dir / 'launch.json'}: {e}") from None
    return launch.Launch(state, args.address, study).run()
