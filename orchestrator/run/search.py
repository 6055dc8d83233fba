"""Every model/task pair of a launch in one Tune experiment.

Each pair keeps what makes its search its own: an Optuna TPE study over its own space (or, for an
ablation, its own list of grid cells x seeds), its own concurrency limit and its own ASHA brackets.
`PairSearch` interleaves the pairs' suggestions and `PairScheduler` routes each trial to its pair's
scheduler, so one Tuner keeps the whole cluster busy: when one pair's search runs out of trials to
start (its tail), another pair's trials take the free slots.
"""

from __future__ import annotations

import contextlib
import math
import pickle
import time
import warnings
from typing import NamedTuple

import optuna
from optuna.trial import FrozenTrial, TrialState
from ray.tune.result import TRAINING_ITERATION
from ray.tune.schedulers import FIFOScheduler, TrialScheduler
from ray.tune.search import Searcher
from ray.tune.search.optuna import OptunaSearch

from trainables.config import MEMBER_KEYS
from trainables.models import batchable

from ..record.retries import retry_delays, transient
from ..record.runs import member_result
from .stacking import MEMBERS_KEY, stack_cuts

PAIR_KEY = "pair"  # the trial config key that names the trial's pair
RUN_ATTR = (
    "run"  # an Optuna trial's user attribute: its MLflow run's run_key (settle_proposals finds its end there)
)
CANDIDATE_KEY = "candidate"  # in a confirmation trial's config: which of the pair's top trials it repeats


def own_config(config: dict) -> dict:
    """A trial's config without the keys that only route it (its pair, its candidate, its stacked members)."""
    return {k: v for k, v in config.items() if k not in (PAIR_KEY, CANDIDATE_KEY, MEMBERS_KEY)}


def trial_members(config: dict) -> list[int | None]:
    """The indices of a trial's stacked members, else [None] (its own config is its one run's)."""
    return list(range(len(config[MEMBERS_KEY]))) if config.get(MEMBERS_KEY) else [None]


def run_key(trial_id: str, member: int | str | None) -> str:
    """A run of a Tune trial (one of its stacked members, where it stacks), as RUN_ATTR names it."""
    return trial_id if member is None else f"{trial_id}/{member}"


def member_config(config: dict, member: int | None) -> dict:
    """One member's config of a trial: the trial's own config with the member's values."""
    return {**own_config(config), **(config[MEMBERS_KEY][member] if member is not None else {})}


def stored_trials(storage, study_name: str) -> int:
    """How many trials the study `study_name` holds in `storage` (0 where there is no such study)."""
    if storage is None:
        return 0
    try:
        study_id = storage.get_study_id_from_name(study_name)
    except KeyError:
        return 0
    return len(storage.get_all_trials(study_id, deepcopy=False))


class Found(NamedTuple):
    """What a driver found in its pair's study (TruncationAwareOptunaSearch.found_trials)."""

    running: list[FrozenTrial]  # proposals of killed drivers, and trials Tune's snapshot holds
    ended: frozenset[int]  # the numbers of trials told of their end


class TruncationAwareOptunaSearch(OptunaSearch):
    """Ray tells Optuna a trial that ASHA stopped is COMPLETE with its truncated score, so TPE would
    learn from scores of unequal budgets. We tell it PRUNED instead (and the same for a diverged
    trial): TPE then ranks it below every completed trial, ordered by the intermediate values it
    reported, so the search learns "worse than finished ones" and no more.

    Intermediate values are reported at the training iteration (MLflow's step axis), not at Tune's
    count of reports; and the result a scheduler stops a trial on, which Tune hands to
    on_trial_complete only, is reported too, so Optuna's last value is MLflow's.

    With `stack` > 1 a Tune trial trains up to `stack` suggestions at once (trainables.batched):
    TPE is asked once per member, each member is an Optuna trial of its own (the last stacks cut as
    stacking.stack_cuts cuts them: no member left alone), and the members share
    the first suggestion's values of every key but MEMBER_KEYS (Optuna's fixed parameters), so
    their model shapes are one. `runs` is then the pair's budget in suggestions, and `base` the
    pair's config, which says whether a suggestion's model stacks at all."""

    # On the class, not set in __init__: Tune unpickles the searcher of a launch that an earlier
    # version began (tuner.pkl) without calling __init__, and a resume must not fail on them.
    found: Found | None = None  # the study as this driver found it (found_trials)
    told: frozenset[int] = frozenset()  # the Optuna trials this searcher told of their end

    def __init__(self, *args, stack: int = 1, runs: int = 0, base: dict | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.stack, self.runs_left, self.base = stack, runs, base or {}
        self.members: dict[str, list] = {}  # trial id -> the Optuna trials of its stacked members

    def _setup_study(self, mode):
        if stored_trials(self._storage, self._study_name):
            # A new searcher on a study a killed driver began (it died before Tune's first
            # snapshot): the warm start is in the study already, and a sampler seeded as that
            # driver's was would propose its trials again.
            self._points_to_evaluate = None
            if self._sampler is not None:
                self._sampler.reseed_rng()
            self._seed = None  # where Ray makes the sampler itself
        super()._setup_study(mode)

    def resumed(self) -> None:
        """After a resume from Tune's snapshot: the sampler's random state is the snapshot's, so
        its next draws would repeat the proposals the killed driver made after it (which adopted
        trials now hold); and what the killed driver found in the study is older than its end."""
        self._ot_study.sampler.reseed_rng()
        self.found = None

    def found_trials(self) -> Found:
        """The study as this driver found it, read once: the launch's driver lock keeps any other
        driver out of the study while this one runs, so what the killed drivers before it left
        (proposals no trial took, trials told of their end) is all there is to find, and a
        suggestion need not read the study for it again."""
        if self.found is None:
            trials = self._ot_study.get_trials(deepcopy=False)
            self.found = Found(
                [t for t in trials if t.state == TrialState.RUNNING],
                frozenset(t.number for t in trials if t.state.is_finished()),
            )
        return self.found

    def trials_of(self, trial_id) -> list[tuple]:
        """(Optuna trial, member index or None) of each run a Tune trial trains."""
        if len(self.members.get(trial_id, ())) > 1:
            return [(trial, k) for k, trial in enumerate(self.members[trial_id])]
        return [(self._ot_trials[trial_id], None)] if trial_id in self._ot_trials else []

    def on_trial_result(self, trial_id, result):
        if trial_id in self._completed_trials:
            return
        for trial, member in self.trials_of(trial_id):
            # A member's own iteration: one that diverged keeps its last metrics while the stack
            # trains on, and reporting them at the stack's iteration would rank it as one that
            # trained longest instead of one stopped where it diverged.
            own = member_result(result, member)
            step, value = own.get("iteration", own.get(TRAINING_ITERATION)), own.get(self.metric)
            if (
                step is None or value is None or not math.isfinite(value)
            ):  # one diverged before its first evaluation has no score
                continue
            with warnings.catch_warnings(), contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError):
                # A restored trial replays evaluations Optuna may have already: ignoring them is right.
                # It may even have the trial's end, told by a driver killed before Tune's snapshot
                # recorded it (the trial, restored at its last checkpoint, reports that evaluation again).
                warnings.filterwarnings("ignore", message="The reported value is ignored")
                trial.report(value, int(step))

    def orphans(self, taken: set[int]) -> list:
        """Proposals a killed driver made and no trial took (Optuna stored them, Tune's snapshot did
        not have them), but those numbered in `taken`."""
        mine = (
            {t.number for t in self._ot_trials.values()}
            | {t.number for ts in self.members.values() for t in ts}
            | taken
        )
        return [t for t in self.found_trials().running if t.number not in mine]

    def suggest(self, trial_id):
        """TPE's next proposal (or a stack of them); first, one a killed driver made and no trial
        took: the new trial adopts it instead of leaving it RUNNING in the study beside a duplicate."""
        if trial_id not in self._ot_trials and self._ot_study is not None:
            if self.stack > 1 and self.runs_left <= 0:
                return Searcher.FINISHED
            found = self.orphans(set())
            if found:
                self._ot_trials[trial_id] = optuna.trial.Trial(self._ot_study, found[0]._trial_id)
        params = super().suggest(trial_id)
        if self.stack == 1 or params is None:
            self.label(trial_id)
            return params
        if trial_id not in self.members:
            first = self._ot_trials[trial_id]
            shared = {k: v for k, v in first.params.items() if k not in MEMBER_KEYS}
            size = (
                stack_cuts(self.runs_left, self.stack)[0] if batchable({**self.base, **shared}) is None else 1
            )
            self.members[trial_id] = [first]
            while len(self.members[trial_id]) < size:
                self.members[trial_id].append(
                    self.ask_sharing(shared, {t.number for t in self.members[trial_id]})
                )
            self.runs_left -= size
            self.label(trial_id)
        trials = self.members[trial_id]
        if len(trials) == 1:
            return params
        return {
            **{k: v for k, v in params.items() if k not in MEMBER_KEYS},
            MEMBERS_KEY: [{k: v for k, v in t.params.items() if k in MEMBER_KEYS} for t in trials],
        }

    def label(self, trial_id) -> None:
        """Each Optuna trial a Tune trial trains is told which run it is (RUN_ATTR)."""
        for trial, member in self.trials_of(trial_id):
            trial.set_user_attr(RUN_ATTR, run_key(trial_id, member))

    def ask_sharing(self, shared: dict, taken: set[int]):
        """One more member of a stack: TPE's proposal for the member keys, with `shared` fixed."""
        for orphan in self.orphans(taken):
            if all(orphan.params.get(k) == v for k, v in shared.items()):
                return optuna.trial.Trial(self._ot_study, orphan._trial_id)
        self._ot_study.enqueue_trial(shared, skip_if_exists=False)
        # Waiting proposals a killed driver enqueued are handed out before ours: they are no members here.
        for _ in range(len(self._ot_study.get_trials(deepcopy=False, states=(TrialState.WAITING,)))):
            trial = self._ot_study.ask(fixed_distributions=self._space)
            if all(trial.params.get(k) == v for k, v in shared.items()):
                return trial
            self._ot_study.tell(trial, state=TrialState.FAIL)
        raise RuntimeError(
            f"Optuna handed out no proposal with {shared}"
        )  # no store does this: ours was waiting

    def retry(self, trial_id) -> None:
        """Tune runs a trial that failed for good again when the launch is resumed (from its last
        checkpoint), without asking the searcher. Its Optuna trials were told FAIL, which is final:
        each of its runs gets a new one, with the same values and the evaluations it had reported."""
        study = {t.number: t for t in self._ot_study.get_trials(deepcopy=False)}
        taken = set()
        for failed, member in self.trials_of(trial_id):
            again = self.ask_sharing(failed.params, taken)
            taken.add(again.number)
            for step, value in study[failed.number].intermediate_values.items():
                again.report(value, step)
            if member is None or member == 0:
                self._ot_trials[trial_id] = again
            if member is not None:
                self.members[trial_id][member] = again
        self._completed_trials.discard(trial_id)
        self.label(trial_id)

    def told_already(self, trial) -> bool:
        """Whether this trial was told of its end, by this searcher or by a driver killed after
        telling Optuna and before Tune's snapshot recorded the end (the resumed one sees the trial
        end again)."""
        return trial.number in self.told or trial.number in self.found_trials().ended

    def told_in_store(self, trial) -> bool:
        """Whether Optuna's storage has this trial finished, read now."""
        return trial.number in {
            t.number
            for t in self._ot_study.get_trials(
                deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
            )
        }

    def on_trial_complete(self, trial_id, result=None, error=False):
        if trial_id in self._completed_trials:
            return
        if result:  # the result a scheduler stopped the trial on reached no on_trial_result
            self.on_trial_result(trial_id, result)
        for trial, member in self.trials_of(trial_id):
            if self.told_already(trial):
                continue
            own = member_result(result or {}, member)
            value = own.get(self.metric) if own.get("status") == "completed" else None
            # A trial that ended failed (trial.run_trial) is as one Tune ended with an error.
            failed = error or own.get("status") == "failed"
            state = (
                TrialState.COMPLETE if value is not None else TrialState.FAIL if failed else TrialState.PRUNED
            )
            self.tell(trial, value, state)
        self._completed_trials.add(trial_id)

    def tell(self, trial, value, state) -> None:
        """Optuna told of a trial's end, retried while the store drops connections (Ray's own
        call logs the failure and goes on, leaving the trial RUNNING in the study for ever); a
        tell whose commit landed before its connection dropped is not told twice."""
        for delay in (*retry_delays(), None):
            try:
                self._ot_study.tell(trial, value, state=state)
                break
            except Exception as e:
                if not transient(e) or delay is None:
                    raise
                time.sleep(delay)
                if self.told_in_store(trial):
                    break
        self.told |= {trial.number}


class CellSearch(Searcher):
    """An ablation pair: its grid cells x seeds, in order, once each."""

    def __init__(self, cells: list[dict], metric: str, mode: str):
        super().__init__(metric=metric, mode=mode)
        self.cells, self.next = cells, 0

    def suggest(self, trial_id):
        if self.next >= len(self.cells):
            return Searcher.FINISHED
        self.next += 1
        return dict(self.cells[self.next - 1])

    def on_trial_complete(self, trial_id, result=None, error=False):
        pass

    def retry(self, trial_id) -> None:
        pass  # a cell's trial is the same cell when Tune runs it again


class PairSearch(Searcher):
    """Suggests trials for every pair, round-robin over the pairs that may start one: a pair may
    start one while it has budget left and fewer than `max_concurrent` trials live."""

    def __init__(
        self,
        searchers: dict[str, Searcher],
        budgets: dict[str, int],
        max_concurrent: int,
        metric: str,
        mode: str,
    ):
        super().__init__(metric=metric, mode=mode)
        self.searchers, self.budgets, self.max_concurrent = searchers, budgets, max_concurrent
        self.started = {name: 0 for name in searchers}
        self.exhausted: set[str] = set()
        self.live: dict[str, str] = {}  # trial id -> pair
        self.failed: dict[
            str, str
        ] = {}  # trial id -> pair, of trials that failed for good (a resume runs them again)
        self.turn = 0

    def set_search_properties(self, metric, mode, config, **spec) -> bool:
        return True  # each pair's searcher was built with its own space, metric and mode

    def suggest(self, trial_id):
        names = list(self.searchers)
        for k in range(len(names)):
            name = names[(self.turn + k) % len(names)]
            if name in self.exhausted or self.started[name] >= self.budgets[name]:
                continue
            if sum(1 for pair in self.live.values() if pair == name) >= self.max_concurrent:
                continue
            config = self.searchers[name].suggest(trial_id)
            if config == Searcher.FINISHED:
                self.exhausted.add(name)
                continue
            if config is None:
                continue
            self.turn = (self.turn + k + 1) % len(names)
            self.started[name] += 1
            self.live[trial_id] = name
            return {**config, PAIR_KEY: name}
        if all(name in self.exhausted or self.started[name] >= self.budgets[name] for name in names):
            return Searcher.FINISHED
        return None

    def revived(self, trial_id) -> None:
        """A trial that had failed for good reports again: a resume runs it (resume_errored)."""
        if trial_id in self.failed:
            self.live[trial_id] = self.failed.pop(trial_id)
            self.searchers[self.live[trial_id]].retry(trial_id)

    def on_trial_result(self, trial_id, result):
        self.revived(trial_id)
        if trial_id in self.live:
            self.searchers[self.live[trial_id]].on_trial_result(trial_id, result)

    def on_trial_complete(self, trial_id, result=None, error=False):
        self.revived(trial_id)
        if trial_id in self.live:
            pair = self.live.pop(trial_id)
            self.searchers[pair].on_trial_complete(trial_id, result=result, error=error)
            if error:
                self.failed[trial_id] = pair

    def save(self, checkpoint_path: str):
        # OptunaSearch pickles its __dict__ (the study handle included, whose RDB storage reconnects).
        with open(checkpoint_path, "wb") as f:
            pickle.dump(
                {
                    "own": {k: v for k, v in self.__dict__.items() if k != "searchers"},
                    "searchers": {name: s.__dict__ for name, s in self.searchers.items()},
                },
                f,
            )

    def restore(self, checkpoint_path: str):
        try:
            with open(checkpoint_path, "rb") as f:
                saved = pickle.load(f)  # connects the Optuna storage (optuna_store.RetryingStorage)
        except Exception as e:
            raise ResumeFailed(f"the search's state could not be read back: {e}") from e
        self.__dict__.update(saved["own"])
        self.__dict__.setdefault("failed", {})  # a launch begun before failed trials were kept
        for name, state in saved["searchers"].items():
            self.searchers[name].__dict__.update(state)
            if isinstance(self.searchers[name], TruncationAwareOptunaSearch):
                self.searchers[name].resumed()


class ResumeFailed(BaseException):
    """A resume that could not read its state back. Tune meets any Exception in a resume by
    starting the experiment afresh in the same folder: its next snapshot lists no trial, and every
    resume after it fails (a chaos soak resumed during a database outage and looped so). A
    BaseException passes Tune's handler; Launch.run_phase stops the launch, its state untouched."""


class PairScheduler(FIFOScheduler):
    """Routes each trial to its pair's scheduler, so ASHA compares a trial only with its own pair's."""

    def __init__(self, schedulers: dict[str, TrialScheduler]):
        super().__init__()
        self.schedulers = schedulers

    def _of(self, trial) -> TrialScheduler:
        return self.schedulers[trial.config[PAIR_KEY]]

    def set_search_properties(self, metric, mode, **spec) -> bool:
        for scheduler in self.schedulers.values():
            scheduler.set_search_properties(metric, mode, **spec)
        return True

    def on_trial_add(self, tune_controller, trial):
        self._of(trial).on_trial_add(tune_controller, trial)

    def on_trial_error(self, tune_controller, trial):
        self._of(trial).on_trial_error(tune_controller, trial)

    def on_trial_result(self, tune_controller, trial, result):
        return self._of(trial).on_trial_result(tune_controller, trial, result)

    def on_trial_complete(self, tune_controller, trial, result):
        self._of(trial).on_trial_complete(tune_controller, trial, result)

    def on_trial_remove(self, tune_controller, trial):
        self._of(trial).on_trial_remove(tune_controller, trial)

    def debug_string(self) -> str:
        return "\n".join(f"{name}: {s.debug_string()}" for name, s in self.schedulers.items())
