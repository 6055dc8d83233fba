"""A suggestion's cost as a study grows: ask + tell through the search store against Optuna's own.

  python benchmarks/bench_search_store.py [--stored 100 500 1000 2000] [--asks 20]

For each size, a SQLite study of that many finished trials over a space shaped like
search_spaces/ctl.yaml's (TPE, 6 parameters), copied once per storage; then `--asks` rounds of
ask + tell through (1) the service's storage (orchestrator.record.optuna_store.RetryingStorage:
retries and its cache of finished trials), (2) Optuna's cached storage (Optuna puts its cache
around any RDBStorage it is given: a URL here) and (3) the service's storage without its cache,
which reads the whole study at every suggestion. Prints the median milliseconds of an ask + tell
and the service's ratio to Optuna's cached storage (docs/performance.md#the-search-store).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import optuna
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

from orchestrator.record.optuna_store import RetryingStorage

SPACE = {
    "lr": FloatDistribution(1e-5, 1e-2, log=True),
    "dropout": FloatDistribution(0.0, 0.5),
    "weight_decay": FloatDistribution(0.0, 0.1),
    "d_model": CategoricalDistribution([64, 128, 256]),
    "n_heads": CategoricalDistribution([2, 4, 8]),
    "n_layers": IntDistribution(2, 10),
}


class Uncached(RetryingStorage):
    """The service's storage reading the whole study at every call, as it did before its cache."""

    def get_all_trials(self, study_id, deepcopy=True, states=None):
        return self.call("get_all_trials")(study_id, deepcopy=deepcopy, states=states)


def stored_study(folder: Path, n: int) -> Path:
    """A SQLite file holding study `s` with `n` finished trials drawn at random, each with 30
    intermediate values and 2 user attributes."""
    path = folder / f"stored{n}.db"
    study = optuna.create_study(storage=f"sqlite:///{path}", study_name="s", direction="maximize")
    sampler = optuna.samplers.RandomSampler(seed=0)
    trials = []
    for k in range(n):
        params = {key: sampler.sample_independent(study, None, key, d) for key, d in SPACE.items()}
        trials.append(
            optuna.trial.create_trial(
                params=params,
                distributions=SPACE,
                value=k % 97 / 97,
                # as a Tune trial leaves them: a value per evaluation, the run's id
                intermediate_values={step: k % 97 / 97 for step in range(0, 3000, 100)},
                user_attrs={"run_id": f"{k:032x}", "pair": "ctl__ndr"},
            )
        )
    study.add_trials(trials)
    return path


def ask_tell_ms(study: optuna.Study, asks: int) -> float:
    times = []
    for _ in range(asks):
        start = time.perf_counter()
        trial = study.ask(SPACE)
        study.tell(trial, trial.params["dropout"])
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stored", type=int, nargs="+", default=[100, 500, 1000, 2000])
    parser.add_argument("--asks", type=int, default=20)
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storages = {
        "service": RetryingStorage,
        "optuna cached": str,
        "uncached": Uncached,
    }
    print(f"{'stored':>7} " + " ".join(f"{name + ' ms':>16}" for name in storages) + "  service/cached")
    with tempfile.TemporaryDirectory() as folder:
        for n in args.stored:
            source = stored_study(Path(folder), n)
            ms = {}
            for name, load in storages.items():
                copy = Path(folder) / f"{n}-{name.replace(' ', '_')}.db"
                shutil.copy(source, copy)
                sampler = optuna.samplers.TPESampler(seed=0)
                study = optuna.load_study(storage=load(f"sqlite:///{copy}"), study_name="s", sampler=sampler)
                ms[name] = ask_tell_ms(study, args.asks)
            cells = " ".join(f"{ms[name]:16.1f}" for name in storages)
            print(f"{n:7d} {cells}  {ms['service'] / ms['optuna cached']:14.2f}", flush=True)


if __name__ == "__main__":
    main()
