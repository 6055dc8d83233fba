"""A launch's console: one line per evaluation (pair, trial, iteration, metric) and, every
`every_s` seconds, one overall line (trials ended of the budget, best per pair so far, ETA).
Tune's own tables are off (RunConfig verbose=0); lines are plain text, fit for cron and CI logs."""
from __future__ import annotations

import time

from ray.tune import Callback

from .search import PAIR_KEY


class ProgressLines(Callback):
    def __init__(self, metric: str, mode: str, budgets: dict[str, int], n_iters: dict[str, int], every_s: float = 30.0):
        self.metric, self.mode, self.budgets, self.n_iters, self.every_s = metric, mode, budgets, n_iters, every_s
        self.numbers: dict[str, int] = {}  # trial id -> its number within its pair
        self.counts: dict[str, int] = {}  # pair -> trials seen
        self.ended: dict[str, set] = {pair: set() for pair in budgets}
        self.best: dict[str, float] = {}
        self.started = time.monotonic()
        self.last_overall = self.started

    def __getstate__(self):  # pickled into Tune's experiment state: start the clocks afresh on resume
        return self.__dict__ | {"started": None, "last_overall": None}

    def __setstate__(self, state):
        self.__dict__.update(state, started=time.monotonic(), last_overall=time.monotonic())

    def number(self, trial) -> str:
        pair = trial.config[PAIR_KEY]
        if trial.trial_id not in self.numbers:
            self.counts[pair] = self.counts.get(pair, 0) + 1
            self.numbers[trial.trial_id] = self.counts[pair]
        return f"{pair} trial {self.numbers[trial.trial_id]}/{self.budgets.get(pair, '?')}"

    def better(self, value: float, than: float | None) -> bool:
        return than is None or (value < than if self.mode == "min" else value > than)

    def on_trial_result(self, iteration, trials, trial, result, **info):
        pair = trial.config[PAIR_KEY]
        value = result.get(self.metric)
        if isinstance(value, (int, float)) and self.better(value, self.best.get(pair)):
            self.best[pair] = value
        step = result.get("iteration", result.get("training_iteration"))
        shown = "-" if value is None else f"{value:.4f}"
        print(f"[{self.number(trial)}] it {step}/{self.n_iters.get(pair, '?')} {self.metric} {shown}", flush=True)
        self.maybe_overall()

    def on_trial_complete(self, iteration, trials, trial, **info):
        self.ended.setdefault(trial.config[PAIR_KEY], set()).add(trial.trial_id)
        self.maybe_overall(force=True)

    on_trial_error = on_trial_complete

    def maybe_overall(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self.last_overall < self.every_s:
            return
        self.last_overall = now
        ended, total = sum(len(v) for v in self.ended.values()), sum(self.budgets.values())
        pairs_done = sum(1 for pair, budget in self.budgets.items() if len(self.ended.get(pair, ())) >= budget)
        elapsed = now - self.started
        # Trials end at an even pace once the cluster is full: a rough but honest estimate.
        eta = f"{(total - ended) * elapsed / ended / 60:.0f} min" if ended else "after the first trial"
        best = ", ".join(f"{pair} {value:.4f}" for pair, value in sorted(self.best.items()))
        print(f"[launch] pairs done {pairs_done}/{len(self.budgets)}, trials ended {ended}/{total}, "
              f"{elapsed / 60:.1f} min, ETA {eta}; best {self.metric}: {best or '-'}", flush=True)
