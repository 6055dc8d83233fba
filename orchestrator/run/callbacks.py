"""The launch's Tune callbacks: what the driver does as Tune reports each trial.

TrialTracker mirrors every trial of a launch into MLflow, as a child of the launch's run: all
writes happen in the driver, so eight concurrent trials never contend for SQLite's write lock and
workers never open the store; runs are found again by their launch_id/trial_id tags, so a resumed
launch continues its runs instead of duplicating them.

ProgressLines is the launch's console: one line per evaluation (pair, trial, iteration, metric)
and, every `every_s` seconds, one overall line (runs ended of the budget, best per pair so far,
ETA). Tune's own tables are off (RunConfig verbose=0); lines are plain text, fit for cron and CI logs.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections import Counter
from pathlib import Path

from ray.tune import Callback

from ..record.retries import store_outage
from ..record.runs import (
    CONFIG_TAG,
    DATA_HASH_TAG,
    DIVERGED_AT_TAG,
    ERROR_TAG,
    KERNELS_TAG,
    MAX_BATCH,
    REPLAY_KEY,
    STATUS_TAG,
    code_tags,
    end_running_runs,
    error_line,
    member_result,
    numeric_metrics,
    pair_run,
)
from ..record.stores import client
from ..record.summaries import cell_name
from .search import CANDIDATE_KEY, PAIR_KEY, member_config, trial_members

SEARCH_PAGE = 10_000  # runs a page of the launch's trial runs holds


def cell_tags(trial, member: int | None = None) -> dict[str, str]:
    """An ablation trial's grid cell and seed (its config beyond the pair's holds both), or a
    confirmation trial's candidate (its rank in the search, from 1) and seed; `member` picks one of
    a trial's stacked members (and is tagged: its weights are that slice of the trial's checkpoint)."""
    own = member_config(trial.config, member)
    member_tag = {"member": str(member)} if member is not None else {}
    if "seed" not in own:  # a search's trial: a stack's suggestions share the pair's seed
        return member_tag
    tags = {"seed": str(own["seed"]), **member_tag}
    if CANDIDATE_KEY in trial.config:
        return {
            "cell": f"candidate {trial.config[CANDIDATE_KEY] + 1}",
            "candidate": str(trial.config[CANDIDATE_KEY]),
            **tags,
        }
    return {"cell": cell_name({k: v for k, v in own.items() if k != "seed"}), **tags}


def trial_error(trial) -> str:
    """The trial's failures as Tune wrote them to its file, each with its traceback; "" where none.
    Tune's own log of them is kept off the console (ray_start.quiet_ray)."""
    path = getattr(trial, "error_file", None)
    return Path(path).read_text() if path and os.path.exists(path) else ""


def error_words(error: str) -> str:
    """ ": <the last line of the error>" for a console line; "" where there is none."""
    line = error_line(error)
    return f": {line}" if line else ""


class TrialTracker(Callback):
    """Tune callback that mirrors every trial of a launch into MLflow, as a child of the launch's run;
    a trial of stacked members as one run per member (tagged with its trial, seed and member), so MLflow
    and everything that reads it see what separate trials would have written.
    `base_configs` and `tags` are per pair, keyed by the pair named in each trial's config."""

    def __init__(
        self,
        uri: str,
        parent_run_id: str,
        launch_id: str,
        base_configs: dict[str, dict],
        tags: dict[str, dict],
    ):
        self.uri, self.parent_run_id, self.launch_id = uri, parent_run_id, launch_id
        self.base_configs, self.tags = base_configs, tags
        self.runs: dict[str, str] = {}  # trial id (and member) -> its run
        self.pair_runs: dict[str, str] = {}  # pair -> its run, the parent of its trials' runs
        self.located: dict[str, dict] = {}  # run -> the node/device tags this driver has written
        self.last_step: dict[str, int] = {}  # per run, the last iteration whose metrics are in MLflow
        self.ended: set[str] = set()  # trials whose end (complete or error) Tune reported to this driver
        self.known: set[str] = (
            set()
        )  # the trials this driver's Tune holds (restored from its snapshot, or started since)
        # (trial id[/member]) -> run, and pair -> trial runs that count toward a trial's number:
        # read from the store once per driver (stored_runs), then kept as this driver creates runs
        self.stored: tuple[dict[str, str], Counter] | None = None
        self._client = None
        self._experiment_id = None

    def __getstate__(self):  # Tune pickles callbacks into its experiment checkpoint
        return self.__dict__ | {
            "_client": None,
            "located": {},
            "last_step": {},
            "pair_runs": {},
            "known": set(),
            "stored": None,
        }

    def __setstate__(self, state):  # a launch started before `ended` existed resumes too
        self.__dict__.update({"ended": set(), "known": set(), "stored": None, **state})

    @property
    def mlflow(self):
        if self._client is None:
            self._client = client(self.uri)
        return self._client

    def stored_runs(self) -> tuple[dict[str, str], Counter]:
        """This launch's trial runs in the store, read in one search when the driver first needs
        them (a resumed driver's trials have runs already): per trial a search of the experiment
        would grow with it. Counted per pair: the runs of trials this driver's Tune knows, not lost
        (see short_name)."""
        if self.stored is None:
            runs, numbered, token = {}, Counter(), None
            while True:
                page = self.mlflow.search_runs(
                    [self.experiment_id()],
                    filter_string=f"tags.launch_id = '{self.launch_id}' and tags.kind = 'trial'",
                    max_results=SEARCH_PAGE,
                    page_token=token,
                )
                for run in page:
                    tags = run.data.tags
                    runs.setdefault(tags["trial_id"], run.info.run_id)
                    if "member" in tags:
                        runs.setdefault(f"{tags['trial_id']}/{tags['member']}", run.info.run_id)
                    if tags.get(STATUS_TAG) != "lost" and (not self.known or tags["trial_id"] in self.known):
                        numbered[tags["pair"]] += 1
                token = page.token
                if not token:
                    break
            self.stored = runs, numbered
        return self.stored

    def run_id(self, trial, member: int | None = None) -> str:
        key = trial.trial_id if member is None else f"{trial.trial_id}/{member}"
        if key in self.runs:
            return self.runs[key]
        stored, numbered = self.stored_runs()
        pair = trial.config[PAIR_KEY]
        config = {**self.base_configs[pair], **member_config(trial.config, member)}
        if key in stored:
            run_id = stored[key]
            self.mlflow.update_run(run_id, status="RUNNING")
            self.mlflow.set_tag(run_id, STATUS_TAG, "running")  # it may have been interrupted
        else:
            run = self.mlflow.create_run(
                self.experiment_id(),
                run_name=self.short_name(pair, trial, member),
                tags={
                    "mlflow.parentRunId": self.pair_run(pair),
                    "launch_id": self.launch_id,
                    "kind": "trial",
                    "trial_id": trial.trial_id,
                    "pair": pair,
                    **code_tags(),
                    CONFIG_TAG: json.dumps(config, sort_keys=True),
                    STATUS_TAG: "running",
                    **self.tags[pair],
                    **cell_tags(trial, member),
                },
            )
            run_id = stored[key] = run.info.run_id
            numbered[pair] += 1
            self.last_step[run_id] = -1
        # MLflow takes seconds to import: the driver imports it beside Ray's start (stores.warm_up),
        # and the trial workers, which import this module too, never need it.
        from mlflow.entities import Param  # noqa: PLC0415

        # Again for a run found again: a driver killed between create_run and here left it without
        # some params (logging a param again with the same value is allowed).
        params = [
            Param(k, json.dumps(v) if isinstance(v, (dict, list)) else str(v))
            for k, v in sorted(config.items())
        ]
        for start in range(0, len(params), 100):
            self.mlflow.log_batch(run_id, params=params[start : start + 100])
        self.runs[key] = run_id
        return run_id

    def pair_run(self, pair: str) -> str:
        if pair not in self.pair_runs:
            own = {k: v for k, v in self.tags[pair].items() if k != "phase"}
            self.pair_runs[pair] = pair_run(
                self.mlflow, self.experiment_id(), self.parent_run_id, self.launch_id, pair, own
            )
        return self.pair_runs[pair]

    def short_name(self, pair: str, trial, member: int | None = None) -> str:
        """What MLflow's runs table shows before it truncates a name: an ablation trial's cell and
        seed, or a search trial's number within its pair (counted in the store: a resumed driver
        goes on counting) and the values TPE chose; then the pair. The console (ProgressLines) and
        the report number trials alike."""
        cell = cell_tags(trial, member)
        if "cell" in cell:
            return f"{cell['cell']} s{cell['seed']} {pair}"
        # Not the runs of trials this driver's Tune does not know: a killed driver's trials that
        # started after Tune's last snapshot, whose proposals the resumed search makes again (their
        # runs end lost). Their replacements take their numbers, as the console's do (ProgressLines).
        earlier = self.stored_runs()[1][pair]
        chosen = " ".join(
            f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
            for k, v in member_config(trial.config, member).items()
        )
        return f"#{earlier + 1} {chosen} {pair}".replace("  ", " ")

    def experiment_id(self, mlflow=None) -> str:
        if self._experiment_id is None:
            self._experiment_id = (mlflow or self.mlflow).get_run(self.parent_run_id).info.experiment_id
        return self._experiment_id

    def logged_until(self, run_id: str) -> int:
        if run_id not in self.last_step:  # a run from before a driver restart: ask the store, once
            self.last_step[run_id] = max(
                (m.step for m in self.mlflow.get_metric_history(run_id, "loss")), default=-1
            )
        return self.last_step[run_id]

    def run_ids(self, trial) -> dict:
        """Member (None for a trial of one run) -> the MLflow run of that member of the trial."""
        return {member: self.run_id(trial, member) for member in trial_members(trial.config)}

    def on_trial_start(self, iteration, trials, trial, **info):
        self.known = {t.trial_id for t in trials} | {trial.trial_id}
        self.run_ids(trial)

    def on_trial_result(self, iteration, trials, trial, result, **info):
        from mlflow.entities import RunTag  # noqa: PLC0415 - MLflow: seconds, as in run_id

        for member, run_id in self.run_ids(trial).items():
            # A restored trial first replays the evaluations its checkpoint holds: the driver may have
            # died after the trial wrote a checkpoint and before it logged that evaluation.
            for record in json.loads(result.get(REPLAY_KEY) or "[]"):
                self.log(run_id, self.evaluation(run_id, member_result(record, member)))
            # Once per run and driver, and again where they change: a resumed trial may land
            # elsewhere, a stack whose compiled step failed goes on uncompiled.
            own = member_result(result, member)
            where = {
                "node": result.get("hostname", ""),
                **{
                    key: result.get(key, "")
                    for key in ("node_ip", "device", KERNELS_TAG, "node_id", "compile", "bf16")
                },
                **({DATA_HASH_TAG: own[DATA_HASH_TAG]} if DATA_HASH_TAG in own else {}),
            }
            tags = []
            if self.located.get(run_id) != where:
                self.located[run_id] = where
                tags = [RunTag(key, str(value)) for key, value in where.items()]
            self.log(run_id, self.evaluation(run_id, own), tags)

    def evaluation(self, run_id: str, result: dict) -> list:
        """The metrics of one evaluation that MLflow does not have yet, as MLflow's Metrics."""
        from mlflow.entities import Metric  # noqa: PLC0415 - MLflow: seconds, as in run_id

        if result.get("status") in ("diverged", "failed"):
            # No evaluation ran: the loss went NaN or infinite since the last one, whose scores MLflow
            # has at their own step (a stack goes on reporting a diverged member's, unchanged), or the
            # trial raised as on its try before (trial.run_trial).
            return []
        step = int(result.get("iteration", result.get("training_iteration", 0)))
        if step <= self.logged_until(run_id):
            # A trial restored from a checkpoint older than the last evaluation MLflow has
            # replays that evaluation exactly: log it once.
            return []
        self.last_step[run_id] = step
        now = int(time.time() * 1000)
        return [Metric(k, v, now, step) for k, v in numeric_metrics(result).items()]

    def log(self, run_id: str, metrics: list, tags: list = ()) -> None:
        """One write to the store where the batch fits MLflow's limits: each write is a transaction,
        and the driver makes them one after another for every trial
        (docs/performance.md#orchestration-many-trials)."""
        tags = list(tags)
        for start in range(0, max(len(metrics), 1 if tags else 0), MAX_BATCH):
            batch = metrics[start : start + MAX_BATCH]
            self.mlflow.log_batch(run_id, metrics=batch, tags=tags if start == 0 else [])

    def on_trial_complete(self, iteration, trials, trial, **info):
        from mlflow.entities import RunTag  # noqa: PLC0415 - MLflow: seconds, as in run_id

        self.ended.add(trial.trial_id)
        last_result = trial.last_result or {}
        if last_result.get("status") == "failed":
            where = f"after iteration {last_result.get('iteration', 0)}"
            print(
                f"[launch] trial {trial.trial_id} failed again as on its try before, {where}"
                f"{error_words(last_result.get(ERROR_TAG, ''))}; not retried (a fault of its model or "
                "config, not of a node); its traceback is in its MLflow run's error tag",
                flush=True,
            )
        for member, run_id in self.run_ids(trial).items():
            last = member_result(last_result, member)
            status = last.get("status", "completed")
            if status == "running":
                status = "early_stopped"  # the scheduler ended it before its budget
            tags = {STATUS_TAG: status}
            if status == "diverged" and "iteration" in last:  # its metrics stop at the evaluation before
                tags[DIVERGED_AT_TAG] = str(last["iteration"])
            if status == "failed":
                tags[ERROR_TAG] = last.get(ERROR_TAG, "")
            self.log(run_id, [], [RunTag(key, value) for key, value in tags.items()])
            self.mlflow.set_terminated(
                run_id, status="FAILED" if status in ("diverged", "failed") else "FINISHED"
            )

    def on_trial_recover(self, iteration, trials, trial, **info):
        """Its node or process died, or it raised; Tune starts it again from its last checkpoint (afresh
        where it had none), maybe elsewhere. One that raises as on this try ends (trial.run_trial)."""
        print(
            f"[launch] trial {trial.trial_id} failed ({trial.run_metadata.num_failures} time(s))"
            f"{error_words(trial_error(trial))}; restarting it "
            + ("from its last checkpoint" if trial.checkpoint else "from the start (no checkpoint yet)"),
            flush=True,
        )

    def on_trial_error(self, iteration, trials, trial, **info):
        self.ended.add(trial.trial_id)
        error = trial_error(trial)
        print(
            f"[launch] trial {trial.trial_id} failed for good{error_words(error)}; its "
            "traceback is in its MLflow run's error tag",
            flush=True,
        )
        for run_id in self.run_ids(trial).values():
            self.mlflow.set_tag(run_id, STATUS_TAG, "failed")
            if error:
                self.mlflow.set_tag(run_id, ERROR_TAG, error[-4000:])
            self.mlflow.set_terminated(run_id, status="FAILED")

    def on_experiment_end(self, trials, **info):
        """Runs still "running" when Tune stops: a trial that Ctrl-C or SIGTERM interrupted is
        marked so (resume continues it from its checkpoint); Tune's own state cannot tell, since its
        clean-up marks every live trial TERMINATED before this callback, so a trial counts as ended
        only where Tune reported its end. A trial that started after Tune's last experiment
        checkpoint is forgotten when a killed driver is resumed, and Tune proposes a new trial in
        its place; its run is marked lost."""
        known = {trial.trial_id for trial in trials}

        def end(mlflow) -> None:
            end_running_runs(
                mlflow,
                self.experiment_id(mlflow),
                self.launch_id,
                lambda trial_id: "interrupted" if trial_id in known else "lost",
                skip=self.ended,
            )

        # Tune calls this while it handles the error that stops it (tune.run's except clause). Where
        # that is a store that stayed unreachable through every retry, another whole window of retries
        # here would double the wait for the one-line stop: one try, and resume ends the runs.
        if store_outage(sys.exc_info()[1]) is None:
            end(self.mlflow)
            return
        try:
            end(self.mlflow.unretried)
        except Exception:  # the store is down; Launch.stopped_by_outage says so
            pass


class ProgressLines(Callback):
    def __init__(
        self,
        metric: str,
        mode: str,
        budgets: dict[str, int],
        n_iters: dict[str, int],
        every_s: float = 30.0,
        phase: str = "",
        stack_of: str = "mean",
    ):
        self.metric, self.mode, self.budgets, self.n_iters, self.every_s = (
            metric,
            mode,
            budgets,
            n_iters,
            every_s,
        )
        self.stack_of = stack_of  # what a stacked trial's metric is of its members' (trial.run_trial)
        self.phase = f"{phase} " if phase else ""  # "confirmation " for a search's confirmation trials
        self.numbers: dict[str, int] = {}  # trial id -> the number of its (first) run within its pair
        self.counts: dict[str, int] = {}  # pair -> runs seen
        self.ended: dict[str, set] = {pair: set() for pair in budgets}  # runs: "<trial id>/<member>"
        self.best: dict[str, float] = {}
        self.running: dict[
            str, float
        ] = {}  # trial id -> runs' worth of its iterations done (members x iteration / n_iters)
        self.pace_from: tuple[float, float] | None = (
            None  # (time, runs' worth done) at this driver's first evaluation
        )
        self.started = time.monotonic()
        self.last_overall = self.started

    def __getstate__(self):  # pickled with the tuner as the launch starts: start the clocks afresh on resume
        return self.__dict__ | {"started": None, "last_overall": None, "running": {}, "pace_from": None}

    def __setstate__(self, state):
        self.__dict__.update(
            state, started=time.monotonic(), last_overall=time.monotonic(), running={}, pace_from=None
        )

    # Tune saves this with every experiment snapshot and hands it back on resume: the numbers, the
    # runs ended and the best so far carry over ("trial 2/3" stays trial 2, "best" is not "-").
    def get_state(self) -> dict:
        return {"numbers": self.numbers, "counts": self.counts, "ended": self.ended, "best": self.best}

    def set_state(self, state: dict) -> None:
        self.numbers, self.counts, self.best = (
            dict(state["numbers"]),
            dict(state["counts"]),
            dict(state["best"]),
        )
        self.ended = {pair: set(ids) for pair, ids in state["ended"].items()}

    def number(self, trial) -> str:
        """ "<pair> trial 3/8", or for a trial of 4 stacked runs "<pair> runs 5-8/8": budgets count runs."""
        pair, n = trial.config[PAIR_KEY], len(trial_members(trial.config))
        if trial.trial_id not in self.numbers:
            self.numbers[trial.trial_id] = self.counts.get(pair, 0) + 1
            self.counts[pair] = self.counts.get(pair, 0) + n
        first = self.numbers[trial.trial_id]
        which = f"trial {first}" if n == 1 else f"runs {first}-{first + n - 1}"
        return f"{pair} {self.phase}{which}/{self.budgets.get(pair, '?')}"

    def on_trial_start(self, iteration, trials, trial, **info):
        self.number(trial)  # in the order trials start, as TrialTracker names their runs

    def better(self, value: float, than: float | None) -> bool:
        return than is None or (value < than if self.mode == "min" else value > than)

    def on_trial_result(self, iteration, trials, trial, result, **info):
        if result.get("status") == "failed":  # no evaluation: TrialTracker says how it failed
            return
        pair = trial.config[PAIR_KEY]
        value = result.get(self.metric)
        # A stack whose members all diverged reports NaN, which nothing would ever beat.
        if (
            isinstance(value, (int, float))
            and math.isfinite(value)
            and self.better(value, self.best.get(pair))
        ):
            self.best[pair] = value
        step = result.get("iteration", result.get("training_iteration"))
        shown = "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.4f}"
        n_members = len(trial_members(trial.config))
        if n_members > 1:
            shown += f" ({self.stack_of} of {n_members} stacked members)"
        if (
            result.get("status") == "diverged"
        ):  # no evaluation: the loss went NaN or infinite (every member's, in a stack)
            shown += (
                f"; diverged (loss {result.get('loss', 'nan')})"
                if n_members == 1
                else "; every member diverged"
            )
        print(
            f"[{self.number(trial)}] it {step}/{self.n_iters.get(pair, '?')} {self.metric} {shown}",
            flush=True,
        )
        n_iters = trial.config.get("n_iters") or self.n_iters.get(pair)
        if isinstance(step, (int, float)) and n_iters:
            done = n_members * min(step / n_iters, 1.0)
            if trial.trial_id not in self.running and self.pace_from is not None:
                # What a trial did before its first evaluation here (under an earlier driver, or before
                # the pace's start) is no pace of this driver's.
                self.pace_from = (self.pace_from[0], self.pace_from[1] + done)
            self.running[trial.trial_id] = done
        if self.pace_from is None:
            self.pace_from = (time.monotonic(), self.runs_done())
        self.maybe_overall()

    def on_trial_complete(self, iteration, trials, trial, **info):
        self.ended.setdefault(trial.config[PAIR_KEY], set()).update(
            f"{trial.trial_id}/{m}" for m in trial_members(trial.config)
        )
        self.running.pop(trial.trial_id, None)
        self.maybe_overall(force=True)

    on_trial_error = on_trial_complete

    def maybe_overall(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self.last_overall < self.every_s:
            return
        self.last_overall = now
        ended, total = sum(len(v) for v in self.ended.values()), sum(self.budgets.values())
        pairs_done = sum(
            1 for pair, budget in self.budgets.items() if len(self.ended.get(pair, ())) >= budget
        )
        elapsed = now - self.started
        best = ", ".join(f"{pair} {value:.4f}" for pair, value in sorted(self.best.items()))
        print(
            f"[launch] {self.phase}pairs done {pairs_done}/{len(self.budgets)}, runs ended {ended}/{total}, "
            f"{elapsed / 60:.1f} min, ETA {self.eta(now, total)}; best {self.metric}: {best or '-'}",
            flush=True,
        )

    def runs_done(self) -> float:
        """Runs ended, and the running trials' runs in proportion to their iterations."""
        return sum(len(v) for v in self.ended.values()) + sum(self.running.values())

    def eta(self, now: float, total: int) -> str:
        """The runs left at the pace the runs' iterations went since this driver's first evaluation
        (after the first trials' start-up and compiles): a rough but honest estimate, also while the
        first trials run (a stack of a pair's seeds may be the only trial for half an hour)."""
        done = self.runs_done()
        if self.pace_from is None or done <= self.pace_from[1] or now <= self.pace_from[0]:
            return "after the second evaluation"
        pace = (done - self.pace_from[1]) / (now - self.pace_from[0])
        return f"{max(total - done, 0) / pace / 60:.0f} min"
