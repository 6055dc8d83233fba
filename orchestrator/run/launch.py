"""Run a Study on Ray Tune: every model/task pair in one experiment, Optuna TPE proposing per pair,
ASHA stopping per pair, every trial checkpointed to storage the whole cluster sees; then, for a
search with `confirm`, its best trials again over new seeds, as a second experiment.

A launch lives in `<storage_path>/<launch_id>/` on the driver: `launch.json` and `driver.lock`
(state.py reads both without Ray), `best/<pair>.yaml` (the answer's config per pair, accepted by
`orchestrator train`) and `report/`. Tune's experiments (`tune`, and `confirm`) and the trial
checkpoints live in `<storage>/<launch_id>/`, where `storage` defaults to `storage_path` (one
machine) and is a shared folder or an object store on a real cluster.

`Launch` reads in the order a launch goes: set up (`Launch.begin` for a new one, or a `Launch` of
a launch.json to resume), then `run` its phases under the driver's lock, then `answer`.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import signal
import sys
from typing import IO

from ..plan.study import Study
from ..record.best import summaries_of, write_best
from ..record.retries import DiskFull, StoreUnavailable, store_outage
from ..record.runs import close_launch, interrupt_launch, launch_trial_runs
from ..record.secrets import redact
from ..record.state import Heartbeat, LaunchState
from ..record.stores import normalize_store, warm_up
from ..record.summaries import ended_runs, fallen_pairs, summarize_pairs, top_configs
from ..record.tables import launch_table
from ..report.answer import answer_lines
from ..report.report import verdict_lines, write_launch_report, write_report
from .disk import as_disk_full, least_free
from .exits import EXIT_INTERRUPTED, EXIT_REGRESSION, EXIT_STORE_UNREACHABLE, EXIT_TRIALS_FAILED, EXIT_USAGE
from .interruption import CalmStop
from .preflight import check_cuda, check_fits, check_storage, measure_stack_sizes
from .ray_start import quiet_tune, start_ray
from .registry import hold_driver_lock, register
from .search import ResumeFailed
from .stacking import decide, launched
from .tuner import (
    CONFIRM,
    SEARCH,
    cluster_slots,
    experiment_location,
    optuna_storage,
    optuna_study_name,
    pending_limit,
    phase_cells,
    phase_runs,
    phase_tuner,
    settle_proposals,
    watched_places,
)


class Launch:
    """One launch on its driver: its record (launch.json), its plan as it stacks, and the cluster it
    runs on. Set up by `begin` (a new launch) or by the constructor (one launch.json holds, to
    resume); `run` runs its phases and answers."""

    @classmethod
    def begin(
        cls,
        study: Study,
        spec_text: str,
        launch_id: str | None,
        address: str | None,
        night: int | None = None,
    ) -> Launch:
        """Join (or start) Ray, check the cluster and the trial storage, decide how trials stack, then
        register the launch (as the nightly job's night `night`, if given)."""
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            # Seconds of MLflow's imports while Ray starts; nothing is written (a new store gets its
            # tables) until the cluster has been checked and has seen the storage.
            warming = pool.submit(warm_up, normalize_store(study.tracking.uri))
            use_gpu = start_ray(address)
            check_fits(study, use_gpu)
            stacking = decide(study, use_gpu)
            check_storage(study.storage, "storage")
            if use_gpu:
                check_cuda(study)
                stacking = dataclasses.replace(stacking, stack_sizes=measure_stack_sizes(stacking))
            warming.result()
        state, lock = register(study, spec_text, launch_id, night, stacking)
        print(f"[launch] id {state.launch_id}; resume with: orchestrator resume {state.dir}", flush=True)
        return cls(state, address, lock=lock)

    def __init__(
        self, state: LaunchState, address: str | None, study: Study | None = None, lock: IO | None = None
    ):
        """`study`: state.study(), where the caller has read it already; `lock`: driver.lock as
        registration took it (else `run` takes it). Its trials stack as launch.json says: a resume
        repeats the launch's."""
        self.state, self.address, self.lock = state, address, lock
        self.stacking = launched(study or state.study(), state)
        self.study = self.stacking.study
        self.use_gpu = False

    def run(self) -> int:
        """Run (or continue) the launch until every trial has ended, its confirmation phase included;
        then answer. Returns the exit status: 0, EXIT_STORE_UNREACHABLE after a store outage,
        EXIT_INTERRUPTED after Ctrl-C / SIGTERM, EXIT_REGRESSION where a night of the nightly job
        regressed from the night before, else EXIT_TRIALS_FAILED where trials failed for good (a
        script must not take such a launch's answer for a whole one)."""
        state, study = self.state, self.study
        self.use_gpu = start_ray(self.address)
        slots = cluster_slots(self.stacking, self.use_gpu)
        quiet_tune()
        print(
            f"[launch] {state.launch_id}: {len(study.pairs)} pairs, up to {slots} trials at once on "
            f"{'GPU' if self.use_gpu else 'CPU'}; "
            f"MLflow {redact(state.tracking_uri)} experiment {study.experiment!r}",
            flush=True,
        )
        lock = self.lock or hold_driver_lock(state.dir)
        if lock is None:  # another driver took it after the command's check
            print(
                f"orchestrator: error: {state.dir}: a driver is running this launch now; "
                f"`orchestrator status {state.dir}` shows its progress",
                file=sys.stderr,
                flush=True,
            )
            return EXIT_USAGE
        with lock, Heartbeat(state.dir / "driver.lock"):
            try:
                return self.run_phases()
            except StoreUnavailable as e:  # outside Tune's run: registering, summarizing, reporting
                return self.stopped_by_outage(e)
            except OSError as e:  # a file of the launch (launch.json, its answer's) on a full disk
                if (full := as_disk_full(e)) is None:
                    raise
                return self.stopped_by_outage(full)
            except KeyboardInterrupt:  # Ctrl-C outside Tune's run (which stops calmly by itself)
                if state.state != "finished":  # else only the closing lines were cut short
                    # A further one would cut the record short.
                    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
                    try:
                        self.mark_interrupted()
                    finally:
                        signal.signal(signal.SIGINT, previous)
                return EXIT_INTERRUPTED

    def run_phases(self) -> int:
        """run's work, under the driver's lock: every phase, then the answer."""
        self.state.state = "running"
        self.state.save()
        code, errors = self.run_phase(SEARCH)
        if code == 0 and self.study.confirm.top_k and not self.study.is_ablation:
            code, more_errors = self.confirm()
            errors += more_errors
        return code or self.answer(errors)

    def run_phase(self, phase: str) -> tuple[int, int]:
        """Run (or continue, from its Tune experiment) one phase until its trials have ended.
        -> (exit status: 0, EXIT_STORE_UNREACHABLE, EXIT_INTERRUPTED; trials that failed for good)."""
        # A phase's own concurrency: a stacked search may be a trial or two per pair, its confirmation many.
        cells = phase_cells(self.stacking, self.state, phase) if phase == CONFIRM else None
        slots = cluster_slots(self.stacking, self.use_gpu, cells)
        tuner = phase_tuner(self.stacking, self.state, self.use_gpu, slots, phase)
        with CalmStop(), pending_limit(slots):
            try:
                tuner.fit()
            except (ResumeFailed, Exception) as e:
                # A store's outage or full disk, or a write of Tune's or a trial's on a full disk
                unavailable = store_outage(e) or as_disk_full(e)
                if unavailable is None:
                    raise
                return self.stopped_by_outage(unavailable), 0
            return self.phase_outcome(phase)

    def confirm(self) -> tuple[int, int]:
        """A search's confirmation phase: its best trials again over new seeds. -> as run_phase."""
        state, study = self.state, self.study
        if state.candidates is None:  # chosen once: a resumed confirmation repeats the same trials
            state.candidates = top_configs(state.tracked, study.metric, study.score, study.confirm.top_k)
            state.save()
        print(
            f"[launch] confirming: the {study.confirm.top_k} best trials of each pair again with seeds "
            f"{', '.join(map(str, study.confirm.seeds))}",
            flush=True,
        )
        return self.run_phase(CONFIRM)

    def phase_outcome(self, phase: str) -> tuple[int, int]:
        """-> (0 or EXIT_INTERRUPTED, runs failed for good) once a phase's Tune run has returned."""
        state = self.state
        total = sum(phase_runs(self.study, phase_cells(self.stacking, state, phase)).values())
        # Counted from our records: Tune's clean-up after Ctrl-C marks unfinished trials TERMINATED.
        ended, failed = ended_runs(state.tracked, "confirm" if phase == CONFIRM else "search")
        if ended < total:
            self.mark_interrupted(
                f"with {ended} of {total} {'confirmation ' if phase == CONFIRM else ''}runs ended"
            )
            return EXIT_INTERRUPTED, failed
        return 0, failed

    def answer(self, errors: int) -> int:
        """Once every phase has ended: the answer's files, the launch closed in MLflow and
        launch.json, and the closing lines. -> the exit status (see run)."""
        state, study = self.state, self.study
        written, regressions, summaries = self.write_answer()
        fallen = fallen_pairs(launch_trial_runs(state.tracked))
        close_launch(state.tracking_uri, state.parent_run_id, launch_status="finished")
        state.state = "finished"
        # A first night compared with none: no verdict.
        if state.night is not None and getattr(regressions, "compared", None):
            state.regressed = bool(regressions)
        state.save()
        for path in written:
            print(f"[launch] wrote {path}", flush=True)
        print_summary(state, study, summaries)
        if errors:
            print(
                f"[launch] {errors} run(s) failed: each one's error is in the report's trial table and "
                "`orchestrator export` (its last line), its traceback in its MLflow run's error tag",
                flush=True,
            )
        if fallen:
            print(f"[launch] every run of {', '.join(fallen)} diverged or failed", flush=True)
        for line in verdict_lines(regressions):
            print(f"[launch] {line}", flush=True)
        return EXIT_REGRESSION if regressions else EXIT_TRIALS_FAILED if errors or fallen else 0

    def write_answer(self) -> tuple[list, list, dict | None]:
        """The files of a launch whose phases have ended: an ablation's report (a night's, compared
        with the nights before), or a search's best configs and report once Optuna knows how every
        proposal ended. -> (the files written, the regressions found, a search's summaries per pair)."""
        state, study = self.state, self.study
        if study.is_ablation:
            written, regressions = write_launch_report(state)
            return written, regressions, None
        storage = optuna_storage(state)
        trial_runs = launch_trial_runs(state.tracked)
        for pair in study.pairs:
            searched = [
                r
                for r in trial_runs
                if r.data.tags.get("pair") == pair.name and r.data.tags.get("phase", "search") == "search"
            ]
            settle_proposals(storage, optuna_study_name(state, pair), searched, study.metric)
        summaries = summaries_of(state, trial_runs)
        written = write_best(state, summaries)
        summarize_pairs(state.tracked, state.parent_run_id, study.metric, study.headline, summaries)
        written += write_report(state)[0]
        return written, [], summaries

    def stopped_by_outage(self, error: StoreUnavailable) -> int:
        """One line for a store that stayed unreachable through every retry, or a disk that filled
        up (the launch and its running pairs then recorded interrupted, where the store takes it).
        -> EXIT_STORE_UNREACHABLE."""
        state = self.state
        state.state = "interrupted" if isinstance(error, DiskFull) else "failed"
        # Its disk may be the full one: launch.json then says "running", and `status` the driver gone.
        with contextlib.suppress(OSError):
            state.save()
        reason = str(error)
        if isinstance(error, DiskFull):
            with contextlib.suppress(StoreUnavailable):  # the store's own disk may be the full one
                interrupt_launch(state.tracked, state.parent_run_id)
            if " MiB free" not in reason:  # a store's write that failed: where, and how much is left
                fs, storage_path, _ = experiment_location(state)
                reason += f"; {least_free(watched_places(state, fs, storage_path))}"
        print(
            f"orchestrator: error: {reason}; every trial is checkpointed: "
            f"{'free space, then ' if isinstance(error, DiskFull) else ''}continue with "
            f"`orchestrator resume {state.dir}`",
            flush=True,
        )
        return EXIT_STORE_UNREACHABLE

    def mark_interrupted(self, how: str = "") -> None:
        """The launch stopped before its end (Ctrl-C, SIGTERM): say so in launch.json and MLflow."""
        state = self.state
        state.state = "interrupted"
        state.save()
        interrupt_launch(state.tracked, state.parent_run_id)
        how = f" {how}" if how else ""
        print(f"[launch] interrupted{how}; nothing is lost: orchestrator resume {state.dir}", flush=True)


def print_summary(state: LaunchState, study: Study, summaries: dict | None = None) -> None:
    """The launch's table (record.tables: as `status` shows it), a search's answer, and what to run
    next. `summaries`: a search's summaries_of, where already read."""
    print(f"[launch] summary ({study.metric}, {study.mode}):", flush=True)
    for line in launch_table(state, state.the_plan(), "running", summaries):
        print(f"  {line}", flush=True)
    if not study.is_ablation:
        summaries = summaries or summaries_of(state)
        for line in answer_lines(study, summaries):
            print(f"[launch] {line}", flush=True)
    # A pair's best config is written where one of its trials may answer: none where all diverged or failed.
    best_files = (
        []
        if study.is_ablation
        else [path for path in (state.dir / "best" / f"{p.name}.yaml" for p in study.pairs) if path.exists()]
    )
    later = f"{state.dir / 'report' / 'report.html'}" + (
        f"; orchestrator train {best_files[0]}" if best_files else ""
    )
    print(
        f"[launch] next: orchestrator status {state.dir}; {later}; MLflow's UI: orchestrator ui {state.dir}",
        flush=True,
    )
