"""Bad input: one clear line naming the file, key and reason, exit status 2, nothing launched or written."""

import dataclasses
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from orchestrator.plan.load import load_study
from orchestrator.plan.source import SpecError
from orchestrator.run.stacking import decide, slots_in

ROOT = Path(__file__).resolve().parent.parent
GOOD = {
    "tasks": [{"task": "ctl", "variant": "fwd", "options": {"direction": "forward"}}],
    "models": ["ndr", "lstm"],
    "budget": {"trials": 2, "max_concurrent": 1, "n_iters": 10, "eval_every": 5},
    "space": {"lr": {"loguniform": [1e-4, 1e-3]}, "n_heads": {"choice": [1, 2]}},
}


@pytest.fixture(autouse=True)
def an_idle_machine(monkeypatch):
    """The dry run's busy-machine line (cost.busy_note) depends on this machine's load: kept out of
    the lines these tests read."""
    from orchestrator.run import cost

    monkeypatch.setattr(cost, "busy_note", lambda: None)


def write(tmp_path, data, name="space.yaml") -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return path


def with_(**changes):
    return {**GOOD, **changes}


def evaluating(study, pair_name: str, per_step: float) -> float:
    """Seconds of the evaluations of one of the pair's trials, at `per_step` s per training step, as
    the dry run prices them (tests/test_cost_model.py holds the pricing to its numbers)."""
    from orchestrator.run import cost

    pair = next(p for p in study.pairs if p.name == pair_name)
    return cost.evaluation_time(decide(study, False), pair, per_step)[0]


def test_shipped_search_spaces_and_ablations_are_valid(downloaded_data):
    for path in sorted([*(ROOT / "search_spaces").glob("*.yaml"), *(ROOT / "ablations").glob("*.yaml")]):
        study = load_study(path)
        assert study.pairs, path


def test_good_file_builds_pairs_with_per_model_spaces(tmp_path):
    study = load_study(write(tmp_path, GOOD))
    by_name = {p.name: p for p in study.pairs}
    assert set(by_name) == {"fwd__ndr", "fwd__lstm"}
    assert (
        "n_heads" in by_name["fwd__ndr"].space and "n_heads" not in by_name["fwd__lstm"].space
    )  # an LSTM has no heads
    assert by_name["fwd__ndr"].base["n_iters"] == 10
    assert by_name["fwd__ndr"].warm_start == {"lr": 1.5e-4, "n_heads": 1}  # Table 7: NDR row
    assert load_study(write(tmp_path, with_(space={"attention_dropout": {"uniform": [0.0, 0.5]}}))).pairs[
        0
    ].warm_start == {"attention_dropout": 0.0}


def test_a_pairs_own_values_go_over_the_files_and_its_models(tmp_path):
    """per_pair.<pair>.fixed (a search's winners, from `best --ablation`) over `fixed` and
    per_model's, for that pair alone; its space and an ablation's grid still vary their keys."""
    study = load_study(
        write(
            tmp_path,
            with_(
                fixed={"lr": 0.5, "dropout": 0.2},
                per_model={"ndr": {"fixed": {"lr": 0.4}}},
                space={},
                seeds=[0],
                per_pair={"fwd__ndr": {"fixed": {"lr": 0.003, "n_layers": 4}}},
            ),
        )
    )
    ndr, lstm = (next(p for p in study.pairs if p.model == m) for m in ("ndr", "lstm"))
    assert (ndr.base["lr"], ndr.base["n_layers"], ndr.base["dropout"], lstm.base["lr"]) == (
        0.003,
        4,
        0.2,
        0.5,
    )
    ablation = load_study(
        write(
            tmp_path,
            with_(
                space={},
                grid={"n_layers": [2, 4]},
                seeds=[0],
                per_pair={"fwd__ndr": {"fixed": {"n_layers": 8, "lr": 0.003}}},
            ),
        )
    )
    ndr = next(p for p in ablation.pairs if p.model == "ndr")
    assert ndr.grid == {"n_layers": (2, 4)} and "n_layers" not in ndr.base and ndr.base["lr"] == 0.003
    from orchestrator.cli.describe import describe_study

    assert "  pair fwd__ndr: grid over n_layers (2 cells; " in describe_study(ablation) and describe_study(
        ablation
    ).split("\n")[1].endswith("; its own values (per_pair): lr=0.003")


def test_warm_start_is_moved_into_the_space(tmp_path):
    study = load_study(
        write(tmp_path, with_(space={"d_model": {"choice": [128, 256, 512]}, "n_layers": {"int": [4, 20]}}))
    )
    lstm = next(p for p in study.pairs if p.model == "lstm")
    assert lstm.warm_start == {"d_model": 256, "n_layers": 4}  # Table 7: 200 and 1, nearest in the space
    ndr = next(p for p in study.pairs if p.model == "ndr")
    assert ndr.warm_start == {"d_model": 256, "n_layers": 14}


@pytest.mark.parametrize(
    "content,fragment",
    [
        ("tasks: [ctl\nmodels: [", "line"),
        (with_(modles=["ndr"]), "modles: unknown key (did you mean 'models'?)"),
        (with_(models=["ndrr"]), "models[0]: unknown model 'ndrr' (did you mean 'ndr'?)"),
        (with_(tasks=[{"task": "ctll"}]), "tasks[0].task: unknown task 'ctll' (did you mean 'ctl'?)"),
        (with_(tasks=[{"task": "ctl", "options": {"directon": "backward"}}]), "tasks[0].options: "),
        (with_(space={"lr": {"loguniform": [1e-3, 5e-5]}}), "space.lr.loguniform: empty or inverted range"),
        (with_(space={"lr": {"uniform": [0.1, 0.1]}}), "space.lr.uniform: empty or inverted range"),
        (with_(space={"lr": {"loguniform": [0, 1e-3]}}), "low must be positive"),
        (with_(space={"n_heads": {"choice": []}}), "space.n_heads.choice: expected a non-empty list"),
        (
            with_(space={"n_head": {"choice": [1, 2]}}),
            "space.n_head: no model in this file has this parameter (did you mean 'n_heads'?)",
        ),
        (with_(space={"lr": {"gaussian": [0, 1]}}), "space.lr: unknown distribution 'gaussian'"),
        (
            with_(space={"d_model": {"choice": [128]}, "n_heads": {"choice": [3]}}),
            "space.d_model=128, space.n_heads=3 (fwd__ndr): d_model=128 is not divisible by n_heads=3",
        ),
        (with_(budget={"trials": 0}), "budget.trials: must be a finite positive number"),
        (with_(budget={"trails": 3}), "budget.trails: unknown key (did you mean 'trials'?)"),
        (
            with_(scheduler={"name": "ashaa"}),
            "scheduler.name: unknown scheduler 'ashaa' (did you mean 'asha'?)",
        ),
        (with_(per_model={"bilstm": {"space": {}}}), "per_model.bilstm: model is not in this file's models"),
        (with_(fixed={"batch_sise": 3}), "did you mean 'batch_size'"),
        (with_(tracking={"uri": "mongodb://x"}), "tracking.uri: expected sqlite"),
        (with_(metric="accuracy"), "metric: unknown metric"),
        (with_(mode="min"), "mode: best_ood_valid_acc measures acc, so mode must be max, got 'min'"),
        (
            with_(
                tasks=[{"task": "contextual_retrieval"}],
                models=["transformer"],
                metric="best_ood_valid_l1",
                mode="max",
                space={},
            ),
            "mode: best_ood_valid_l1 measures l1, so mode must be min",
        ),
        (with_(grid={"n_layers": [2, 4]}), "grid: an ablation (grid/seeds) runs every combination"),
        (
            with_(space={}, grid={"n_layerz": [2, 4]}, seeds=[0]),
            "grid.n_layerz: no model in this file has this parameter (did you mean 'n_layers'?)",
        ),
        (with_(space={}, grid={"n_layers": []}), "grid.n_layers: expected a non-empty list"),
        (
            with_(space={}, grid={"n_layers": [2]}, seeds="0-4"),
            "seeds: expected a non-empty list of distinct integers",
        ),
        # Values a trial would reject, found by building its task config and model before launch.
        (
            with_(tasks=[{"task": "ctl", "options": {"direction": "sideways"}}]),
            "tasks[0].options: direction: must be one of forward, backward",
        ),
        (
            with_(tasks=[{"task": "arithmetic", "options": {"p_subexpression": 1.5}}]),
            "p_subexpression: must be a probability in [0, 1)",
        ),
        (
            with_(tasks=[{"task": "ctl", "options": {"train_depths": [4, 2]}}]),
            "train_depths: must be [low, high] with 1 <= low <= high",
        ),
        (
            with_(tasks=[{"task": "listops", "options": {"train_size": 0}}]),
            "train_size: must be a positive integer, got 0",
        ),
        (
            with_(space={"dropout": {"uniform": [0.0, 1.5]}}),
            "space.dropout=1.5 (fwd__ndr): dropout: must be at least 0 and less than 1, got 1.5",
        ),
        (with_(fixed={"d_model": -8}), "fixed (fwd__ndr): "),
        # Grid keys combine: each value builds with the other key's first, the last cell does not.
        (
            with_(space={}, seeds=[0], per_model={"ndr": {"grid": {"d_model": [16, 12], "n_heads": [4, 8]}}}),
            "grid.d_model=12, grid.n_heads=8 (fwd__ndr): ",
        ),
        (with_(fixed={"optimizer": "sgd"}), "optimizer: must be one of adamw, adam, rmsprop"),
        # Text that would end up in MLflow filters or paths.
        (with_(name="it's"), "name: \"it's\" must be 1-100 letters, digits"),
        (with_(tasks=[{"task": "ctl", "variant": "../up"}]), "tasks[0].variant: '../up' must be"),
        (with_(tracking={"experiment": "a b"}), "tracking.experiment: 'a b' must be"),
        # Shapes that used to raise a traceback.
        (with_(budget={"n_iters": "many"}), "budget.n_iters: expected int or null, got 'many'"),
        (with_(tracking={"uri": None}), "tracking.uri: expected str, got None"),
        (with_(per_model={"ndr": 3}), "per_model.ndr: expected a mapping"),
        (
            with_(per_model={"lstm": {"resources": {"gpu": 2}}}),
            "per_model.lstm.resources.gpu: a trial uses at most one GPU; got 2",
        ),
        (
            with_(per_model={"lstm": {"resources": {"gpus": 0.5}}}),
            "per_model.lstm.resources.gpus: unknown key (did you mean 'gpu'?)",
        ),
        (with_(per_model={"lstm": {"resources": 0.5}}), "per_model.lstm.resources: expected a mapping"),
        # Ray hides the GPUs from a trial that asks for none: CUDA would fail at its first step.
        (
            with_(fixed={"device": "cuda"}),
            "fixed.device: cuda needs a GPU, and resources.gpu gives its trials none",
        ),
        (
            with_(
                resources={"gpu": 1},
                per_model={"lstm": {"fixed": {"device": "cuda:0"}, "resources": {"gpu": 0}}},
            ),
            "per_model.lstm.fixed.device: cuda:0 needs a GPU, and "
            "per_model.lstm.resources.gpu gives its trials none",
        ),
        (with_(models=[["ndr"]]), "models[0]: unknown model"),
        (
            with_(per_pair={"fwd__ndrr": {"fixed": {"lr": 0.1}}}),
            "per_pair.fwd__ndrr: not a pair of this file (did you mean 'fwd__ndr'?); its "
            "pairs: fwd__ndr, fwd__lstm",
        ),
        (
            with_(per_pair={"fwd__lstm": {"fixed": {"n_heads": 2}}}),
            "per_pair.fwd__lstm.fixed.n_heads: not an option of model 'lstm' or of training",
        ),
        (
            with_(per_pair={"fwd__lstm": {"lr": 0.1}}),
            "per_pair.fwd__lstm: expected {fixed: {key: value, ...}}, got {'lr': 0.1}",
        ),
        (with_(per_pair={"fwd__lstm": {"fixed": {"lr": "fast"}}}), "fixed (fwd__lstm): "),
        ("name: a\nname: b\n", "line 2: malformed YAML: duplicate key 'name'"),
        # Keys the file sets with keys of its own: they changed what a pair trained, or were overwritten.
        (with_(fixed={"task": "listops"}), "fixed.task: the file's tasks set it"),
        (
            with_(per_model={"ndr": {"fixed": {"model": "transformer"}}}),
            "per_model.ndr.fixed.model: the file's models set it",
        ),
        (
            with_(fixed={"seed": "abc"}),
            "fixed.seed: the file's seed (a search's trials) and seeds (an ablation's) set it",
        ),
        (
            with_(space={"lr": {"loguniform": [1e-4, 1e-3]}, "seed": {"choice": [0, 1]}}),
            "space.seed: the file's seed",
        ),
        (
            with_(per_model={"ndr": {"space": {"task": {"choice": ["ctl", "listops"]}}}}),
            "per_model.ndr.space.task: the file's tasks set it",
        ),
        (with_(space={}, grid={"task": ["ctl", "listops"]}), "grid.task: the file's tasks set it"),
        (
            with_(per_pair={"fwd__lstm": {"fixed": {"task": "listops"}}}),
            "per_pair.fwd__lstm.fixed.task: the file's tasks set it",
        ),
        # A key of the file's space may be one some of its models lack (heads of an LSTM); a model's own
        # space may not.
        (
            with_(per_model={"lstm": {"space": {"n_heads": {"choice": [1, 2]}}}}),
            "per_model.lstm.space.n_heads: not an option of model 'lstm' or of training",
        ),
        # Mann-Whitney's smallest p, 1/C(2n, n), Holm-corrected over the cells: 3 seeds reach 1/20 at best.
        (
            with_(space={}, grid={"n_layers": [2, 4]}, seeds=[0, 1, 2], report={"test": "mannwhitney"}),
            "report.test: mannwhitney with 3 seeds a side can flag no regression among 4 cell(s) at alpha "
            "0.05: its smallest p, 1/20, Holm-corrected over them is 0.2; use welch, "
            "more seeds or fewer cells",
        ),
    ],
)
def test_bad_input_is_one_clear_line(tmp_path, content, fragment):
    path = write(tmp_path, content)
    with pytest.raises(SpecError) as err:
        load_study(path)
    message = str(err.value)
    assert message.startswith(str(path)) and fragment in message and "\n" not in message


def test_mann_whitney_is_taken_where_it_can_flag_a_regression(tmp_path):
    # 5 seeds: 1/252 at best, x 4 cells (2 models x 2 layer counts) = 0.016 < 0.05.
    study = load_study(
        write(
            tmp_path,
            with_(space={}, grid={"n_layers": [2, 4]}, seeds=[0, 1, 2, 3, 4], report={"test": "mannwhitney"}),
        )
    )
    assert study.report.test == "mannwhitney"


def test_a_nightly_of_several_files_shares_its_false_alarm_rate_among_them(tmp_path):
    """The night exits 1 when any file regresses: each of k files is tested at alpha / k (Holm
    within each), so an unchanged night raises a flag at most at alpha, not k times it."""
    from orchestrator.plan.nightly import nightly_files

    for name, alpha in (("a.yaml", None), ("b.yaml", 0.1)):
        write(
            tmp_path,
            with_(
                space={}, grid={"n_layers": [2, 4]}, seeds=[0, 1], report={"alpha": alpha} if alpha else {}
            ),
            name,
        )
    nightly = write(tmp_path, {"ablations": ["a.yaml", "b.yaml"], "budget": {"n_iters": 20}}, "nightly.yaml")
    texts = [yaml.safe_load(text) for _, text in nightly_files(str(nightly))]
    assert [t["report"]["alpha"] for t in texts] == [0.025, 0.05] and all(
        t["budget"]["n_iters"] == 20 for t in texts
    )
    alone = write(tmp_path, {"ablations": ["a.yaml"]}, "alone.yaml")
    assert (
        nightly_files(str(alone))[0][1] is not None
        and "alpha" not in yaml.safe_load(nightly_files(str(alone))[0][1])["report"]
    )
    # A file listed twice would run its night twice on the same seeds (and halve the alpha); a bad
    # budget of the nightly file (its type or its value) is its own, not the first listed file's.
    twice = write(tmp_path, {"ablations": ["a.yaml", "./a.yaml"]}, "twice.yaml")
    bad_budget = write(tmp_path, {"ablations": ["a.yaml"], "budget": {"n_iters": "many"}}, "bad_budget.yaml")
    negative = write(tmp_path, {"ablations": ["a.yaml"], "budget": {"n_iters": -1}}, "negative.yaml")
    # A listed file's YAML error names its line and the parser's reason, as a launch of it does.
    write(tmp_path, "tasks: [ctl\nmodels: [", "broken.yaml")
    lists_broken = write(tmp_path, {"ablations": ["broken.yaml"]}, "lists_broken.yaml")
    for file, at_fault, reason in (
        (twice, twice, "ablations[1]: ./a.yaml is listed twice"),
        (bad_budget, bad_budget, "budget.n_iters: expected int"),
        (negative, negative, "budget.n_iters: must be a finite positive number, got -1"),
        (lists_broken, tmp_path / "broken.yaml", "line 2: malformed YAML: expected ',' or ']', but got ':'"),
    ):
        out = run_cli("nightly", str(file), "--dry-run", "--no-calibrate", cwd=tmp_path)
        assert out.returncode == 2 and out.stderr.startswith(f"orchestrator: error: {at_fault}: {reason}"), (
            out.stderr
        )


def run_cli(*args, cwd, env_extra=None):
    env = {**os.environ, **(env_extra or {})}
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=300,
        env=env,
    )


def test_a_file_that_is_no_text_file_is_one_line_too(tmp_path):
    """A folder, bytes that are not UTF-8, or an unreadable file: the same one line and exit 2 from
    every command that reads one (launch, nightly, train)."""
    latin = tmp_path / "latin.yaml"
    latin.write_bytes(b"# r\xe9sum\xe9\nname: x\n")
    (tmp_path / "folder.yaml").mkdir()
    for path, reason in (
        (tmp_path / "folder.yaml", "a folder, not a file"),
        (latin, "not UTF-8 text (byte 3)"),
    ):
        with pytest.raises(SpecError, match=f"^{re.escape(str(path))}: file: {re.escape(reason)}$"):
            load_study(path)
    out = run_cli("nightly", str(tmp_path / "folder.yaml"), cwd=tmp_path)
    assert (out.returncode, out.stderr) == (
        2,
        f"orchestrator: error: {tmp_path / 'folder.yaml'}: file: a folder, not a file\n",
    )
    out = run_cli("train", str(latin), cwd=tmp_path)
    assert (out.returncode, out.stderr) == (
        2,
        f"orchestrator: error: {latin}: file: not UTF-8 text (byte 3)\n",
    )


def test_cli_bad_input_exits_2_before_launching(tmp_path):
    path = write(tmp_path, with_(models=["ndrr"], tracking={"uri": f"sqlite:///{tmp_path}/store.db"}))
    out = run_cli("launch", str(path), cwd=tmp_path)
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0 and "did you mean 'ndr'" in out.stderr
    assert not (tmp_path / "store.db").exists() and not (tmp_path / "runs").exists()


def test_cli_unreachable_store_is_an_outage_exit_4_and_writes_nothing(tmp_path):
    """Nothing answers: retried for the store's retry window, then exit 4 (resumable, not bad input)."""
    path = write(tmp_path, with_(tracking={"uri": "postgresql+psycopg://nobody@127.0.0.1:1/none"}))
    out = run_cli("launch", str(path), cwd=tmp_path, env_extra={"SYSGEN_STORE_RETRY_S": "1"})
    assert out.returncode == 4, out.stderr
    line = out.stderr.strip().splitlines()[-1]
    assert "unreachable for 1 s (3 tries)" in line and line.endswith(
        "nothing was started: run the command again once the store answers"
    )
    assert not (tmp_path / "runs").exists()


def test_cli_a_store_that_refuses_for_good_exits_2(tmp_path):
    """A database that does not exist, a role the server does not know: no retry mends them."""
    for uri in (
        "postgresql+psycopg://127.0.0.1:5432/no_such_database",
        "postgresql+psycopg://nobody@127.0.0.1/test",
    ):
        path = write(tmp_path, with_(tracking={"uri": uri}))
        out = run_cli("launch", str(path), cwd=tmp_path)
        assert out.returncode == 2 and out.stderr.strip().count("\n") == 0, out.stderr
        assert f"tracking.uri: {uri} refuses the connection: " in out.stderr
    assert not (tmp_path / "runs").exists()


def test_cli_unreachable_tracking_uri_override_exits_4(tmp_path):
    path = write(tmp_path, with_(tracking={"uri": f"sqlite:///{tmp_path}/store.db"}))
    out = run_cli(
        "launch",
        str(path),
        "--tracking-uri",
        "http://127.0.0.1:1",
        cwd=tmp_path,
        env_extra={"SYSGEN_STORE_RETRY_S": "0"},
    )
    assert out.returncode == 4 and out.stderr.startswith(
        "orchestrator: error: tracking server http://127.0.0.1:1 unreachable for 0 s (1 tries): "
    )
    assert not (tmp_path / "runs").exists()


def test_a_retry_window_that_is_not_a_number_is_bad_input(tmp_path):
    out = run_cli(
        "launch",
        str(write(tmp_path, GOOD)),
        "--dry-run",
        cwd=tmp_path,
        env_extra={"SYSGEN_STORE_RETRY_S": "a minute"},
    )
    assert out.returncode == 2 and out.stderr == (
        "orchestrator: error: SYSGEN_STORE_RETRY_S='a minute': expected a number of seconds\n"
    )


def test_models_all_expands_to_every_compatible_pair(tmp_path):
    tasks = [
        {"task": "ctl", "variant": "fwd"},
        {"task": "copy"},
        {"task": "contextual_retrieval", "variant": "cr"},
    ]
    study = load_study(write(tmp_path, with_(tasks=tasks[:1], models="all", space={}, seeds=[0])))
    assert {"fwd__ndr", "fwd__lstm", "fwd__transformer_compositional"} <= {p.name for p in study.pairs}
    study = load_study(
        write(
            tmp_path,
            with_(tasks=tasks[1:2], models="all", space={}, seeds=[0], metric="best_ood_valid_token_acc"),
        )
    )
    assert {p.name for p in study.pairs} == {"copy__panm", "copy__lstm_seq2seq", "copy__transformer_seq2seq"}
    assert any(
        s.startswith("copy x ndr: ndr runs sequence_classification; copy is sequence_to_sequence")
        for s in study.skipped
    )
    # Each kind reports its own scores, so a metric one task lacks is refused before anything runs.
    with pytest.raises(
        SpecError,
        match="metric: best_ood_valid_acc does not exist for task 'copy', which reports token_acc, seq_acc",
    ):
        load_study(write(tmp_path, with_(tasks=tasks[:2], models="all", space={}, seeds=[0])))
    with pytest.raises(
        SpecError, match="metric: best_ood_valid_acc does not exist for task 'contextual_retrieval'"
    ):
        load_study(write(tmp_path, with_(tasks=[tasks[0], tasks[2]], models="all", space={}, seeds=[0])))


def test_cli_prints_incompatible_pairs(tmp_path):
    out = run_cli(
        "launch",
        str(
            write(
                tmp_path,
                with_(tasks=[{"task": "copy"}], models="all", metric="best_ood_valid_token_acc"),
            )
        ),
        "--dry-run",
        "--no-calibrate",
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    assert "copy__panm" in out.stdout and "skipped (incompatible): copy x ndr" in out.stdout


def test_optuna_is_told_stopped_trials_were_pruned(tmp_path):
    """What the TPE searcher learns: a finished trial is COMPLETE with its score; a trial ASHA
    stopped (its last status 'running') or one that diverged is PRUNED, not a truncated COMPLETE.
    The study lives in SQL beside the MLflow store, where anyone can load it."""
    import optuna
    from optuna.trial import TrialState

    from orchestrator.record.state import LaunchState
    from orchestrator.run.tuner import make_searcher, optuna_storage, optuna_study_name

    study = load_study(write(tmp_path, with_(models=["ndr"], budget={"trials": 3, "max_concurrent": 3})))
    state = LaunchState(
        "l1", tmp_path, study.experiment, str(study.path), "", f"sqlite:///{tmp_path}/mlflow.db", "parent"
    )
    limiter = make_searcher(
        study, study.pairs[0], optuna_storage(state), optuna_study_name(state, study.pairs[0])
    )
    outcomes = {"a": "completed", "b": "running", "c": "diverged"}
    for trial_id in outcomes:
        assert limiter.suggest(trial_id) is not None
        limiter.on_trial_result(
            trial_id, {"best_ood_valid_acc": 0.5, "training_iteration": 1, "iteration": 200}
        )
    for (
        trial_id,
        status,
    ) in outcomes.items():  # the result a scheduler stops on reaches on_trial_complete only
        limiter.on_trial_complete(
            trial_id, {"best_ood_valid_acc": 0.6, "status": status, "training_iteration": 2, "iteration": 400}
        )
    stored = optuna.load_study(
        study_name=optuna_study_name(state, study.pairs[0]), storage=f"sqlite:///{tmp_path}/mlflow.optuna.db"
    )
    assert [t.state for t in stored.trials] == [TrialState.COMPLETE, TrialState.PRUNED, TrialState.PRUNED]
    # Optuna's steps are MLflow's (iterations), and its last value is the one MLflow has.
    assert stored.trials[1].intermediate_values == {200: 0.5, 400: 0.6}
    assert stored.trials[0].params["lr"] == 1.5e-4  # the warm start (Table 7) went first


def test_confirm_is_checked(tmp_path):
    study = load_study(write(tmp_path, with_(confirm={"top_k": 2, "seeds": [7, 8, 9]})))
    assert study.confirm_count() == 6
    with pytest.raises(
        SpecError, match=r"confirm.top_k: must be an integer from 0 to budget.trials \(2\), got 3"
    ):
        load_study(write(tmp_path, with_(confirm={"top_k": 3})))
    with pytest.raises(SpecError, match="confirm.seeds: expected a non-empty list of distinct integers"):
        load_study(write(tmp_path, with_(confirm={"top_k": 1, "seeds": [1, 1]})))
    with pytest.raises(SpecError, match="confirm: an ablation runs every seed"):
        load_study(write(tmp_path, with_(space={}, seeds=[0, 1], confirm={"top_k": 1})))


def test_a_models_own_grid_adds_to_the_files(tmp_path):
    """Table 6's layout: every model over d_model, multi-head attention also over its head count."""
    retrieval = {
        "tasks": [{"task": "contextual_retrieval"}],
        "models": ["transformer", "transformer_compositional"],
        "metric": "best_ood_valid_l1",
        "mode": "min",
        "space": {},
        "grid": {"d_model": [64, 128]},
        "seeds": [0],
    }
    study = load_study(
        write(tmp_path, with_(**retrieval, per_model={"transformer": {"grid": {"n_heads": [2, 4, 8]}}}))
    )
    grids = {p.model: p.grid for p in study.pairs}
    assert grids == {
        "transformer": {"d_model": (64, 128), "n_heads": (2, 4, 8)},
        "transformer_compositional": {"d_model": (64, 128)},
    }
    assert (
        study.pairs[1].base["n_heads"] == 2 and study.pairs[1].base["n_retrievals"] == 4
    )  # the preset's S and R
    with pytest.raises(
        SpecError,
        match=r"per_model\.transformer\.grid\.n_hedas: not an option of model 'transformer' or of "
        r"training \(did you mean 'n_heads'\?\)",
    ):
        load_study(write(tmp_path, with_(**retrieval, per_model={"transformer": {"grid": {"n_hedas": [2]}}})))
    with pytest.raises(SpecError, match=r"seeds: missing: an ablation trains each grid cell once per seed"):
        load_study(write(tmp_path, with_(per_model={"ndr": {"grid": {"n_heads": [2]}}})))


def test_launch_id_cannot_leave_the_storage_folder(tmp_path):
    out = run_cli(
        "launch",
        str(write(tmp_path, GOOD)),
        "--dry-run",
        "--no-calibrate",
        "--launch-id",
        "../../elsewhere",
        cwd=tmp_path,
    )
    assert out.returncode == 2 and out.stderr.startswith(
        "orchestrator: error: --launch-id: '../../elsewhere' must be"
    )
    assert not any(tmp_path.glob("**/elsewhere"))


def test_list_names_what_a_file_can_use_and_the_launches(tmp_path, capsys):
    from orchestrator.cli.process import main

    for what, expected in (
        ("tasks", r"copy +sequence_to_sequence +scores token_acc/seq_acc"),
        ("models", "panm "),
        ("presets", "ctl/ndr"),
    ):
        assert main(["list", what]) == 0
        out = capsys.readouterr().out
        assert re.search(expected, out)
        if what == "tasks":  # one column each: every row's scores start where the first row's do
            assert len({line.index(" scores ") for line in out.splitlines()}) == 1
    launch = tmp_path / "runs" / "smoke-1"
    launch.mkdir(parents=True)
    (launch / "launch.json").write_text(
        json.dumps(
            {
                "launch_id": "smoke-1",
                "dir": str(launch),
                "state": "running",
                "experiment": "smoke",
                "spec_file": "s.yaml",
                "spec_text": "",
                "tracking_uri": "",
                "parent_run_id": "",
            }
        )
    )
    assert main(["list", "launches", "--storage-path", str(tmp_path / "runs")]) == 0
    line = capsys.readouterr().out.strip()
    assert line.split()[:3] == [
        "smoke-1",
        "driver",
        "gone",
    ]  # "running" in the file, but no driver holds its lock
    data = json.loads((launch / "launch.json").read_text())
    (launch / "launch.json").write_text(
        json.dumps({**data, "state": "finished", "night": 2, "regressed": True})
    )
    assert main(["list", "launches", "--storage-path", str(tmp_path / "runs")]) == 0
    assert (
        capsys.readouterr().out.strip().endswith("s.yaml  (regressed)")
    )  # a night's verdict: one `accept` could take
    (launch / "launch.json").write_text(json.dumps({**data, "state": "finished", "night": 0}))
    assert main(["list", "launches", "--storage-path", str(tmp_path / "runs")]) == 0
    assert (
        capsys.readouterr().out.strip().endswith("s.yaml  (no earlier night to compare with)")
    )  # not "(no regression)": none was tested


def test_a_driver_on_another_machine_is_alive_while_its_heartbeat_is_recent(tmp_path, monkeypatch):
    """A launch folder on shared storage: the lock of a driver elsewhere cannot be tested from here,
    so its heartbeat (the lock file's mtime, touched every HEARTBEAT_S) tells."""
    import time

    from orchestrator.record import state

    lock = tmp_path / "driver.lock"
    lock.write_text("another-host 1234\n")
    alive, where = state.driver(tmp_path)
    assert alive and where.startswith("on another-host, heard from")
    old = time.time() - state.SILENT_S - 60
    os.utime(lock, (old, old))
    alive, where = state.driver(tmp_path)
    assert not alive and where.startswith("on another-host, silent for")
    lock.write_text(f"{socket.gethostname()} 1\n")  # this machine: the lock itself says, and no one holds it
    assert state.driver(tmp_path) == (False, "on this machine")
    monkeypatch.setattr(state, "HEARTBEAT_S", 0.05)
    os.utime(lock, (old, old))
    with state.Heartbeat(lock):
        deadline = time.time() + 30  # a loaded machine may wake the thread late: wait for its first beat
        while lock.stat().st_mtime <= old and time.time() < deadline:
            time.sleep(0.05)
    assert time.time() - lock.stat().st_mtime < 5


def test_dry_run_prints_the_cost_from_a_calibration_and_writes_nothing(tmp_path):
    cache = tmp_path / "cache"
    out = run_cli(
        "launch",
        str(write(tmp_path, with_(models=["lstm"], space={"lr": {"loguniform": [1e-4, 1e-3]}}))),
        "--dry-run",
        "--calibrate",
        cwd=tmp_path,
        env_extra={"SYSGEN_DATA_CACHE": str(cache)},
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert any(
        line.startswith("  cost of fwd__lstm: 2 trials x 10 steps = 20 training steps; ")
        and " s per step here; 2 evaluation(s) a trial, at most " in line
        and " -> at most " in line
        for line in lines
    ), out.stdout
    assert any(
        line.startswith("  cost in all: 20 training steps = ")
        and " CPU core-hours; on this machine (" in line
        for line in lines
    ), out.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "space.yaml"
    ]  # no store, no launch folder, no data cache


def test_calibration_takes_the_median_step(monkeypatch):
    """One step slowed by other work on a shared machine does not move the estimate (a clock of the
    test's own: each step advances it by its duration)."""
    import torch

    from trainables import timing

    clock, durations = [0.0], iter([0.0, 0.01, 0.01, 0.3, 0.01, 0.01])  # the warm-up, then five timed steps

    def step() -> None:
        clock[0] += next(durations)

    monkeypatch.setattr(timing, "training_step", lambda cfg: (step, torch.device("cpu")))
    monkeypatch.setattr(timing.time, "perf_counter", lambda: clock[0])
    assert timing.seconds_per_step(None, steps=5) == pytest.approx(0.01)


def stored_step_rates(uri: str, rates, stacked: int = 1) -> None:
    """Trial runs as callbacks.TrialTracker leaves them: model, task and device tags, steps_per_s per
    evaluation; with `stacked`, each rate is a stack's of that many members, each a run logging it."""
    import uuid

    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    experiment = client.create_experiment(f"earlier-{uuid.uuid4().hex[:6]}")
    for (model, task, device, rate), member in ((r, m) for r in rates for m in range(stacked)):
        stack = {"trial_id": f"{model}-{task}-{device}-{rate}", "member": str(member)} if stacked > 1 else {}
        run = client.create_run(
            experiment, tags={"kind": "trial", "model": model, "task": task, "device": device, **stack}
        )
        client.log_metric(
            run.info.run_id, "steps_per_s", rate / 2, step=1
        )  # the last evaluation's rate is the run's
        client.log_metric(run.info.run_id, "steps_per_s", rate, step=2)


def test_a_dry_run_does_not_time_gpu_trials_on_a_machine_without_a_gpu(tmp_path, monkeypatch):
    from orchestrator.run import cost

    monkeypatch.setattr(
        cost, "resources", lambda address: ("this machine", {"CPU": 16, "GPU": 2}, [{"CPU": 16, "GPU": 2}])
    )
    monkeypatch.setattr(cost, "cuda_here", lambda: False)
    on_gpus = with_(models=["ndr"], resources={"cpu": 1, "gpu": 0.5})
    lines = list(cost.describe_cost(load_study(write(tmp_path, on_gpus)), calibrate=True))
    assert lines[0].endswith(
        "not timed: its trials train on GPUs and this machine has none (run the dry run on a GPU node or "
        "with --address of a cluster with GPUs, or --no-calibrate)"
    )
    assert "GPU-hours" not in lines[-1]


def test_dry_run_without_calibration_estimates_from_stored_step_rates(tmp_path, monkeypatch):
    """The median steps/s of earlier trials of the model on the device kind, of the same task where
    there are some; GPU-hours where trials get GPUs, CPU core-hours otherwise."""
    import statistics

    from orchestrator.record.runs import step_rates
    from orchestrator.run import cost

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    stored_step_rates(
        uri,
        [
            ("ndr", "ctl", "cpu", 1.0),
            ("ndr", "ctl", "cpu", 2.0),
            ("ndr", "ctl", "cpu", 10.0),
            ("ndr", "listops", "cpu", 50.0),
            ("ndr", "ctl", "cuda:0", 400.0),
            ("ndr", "ctl", "cuda:1", 600.0),
            ("lstm", "listops", "cpu", 3.0),
            ("lstm", "listops", "cpu", 5.0),
        ],
    )  # no lstm trial on ctl: any task's
    budget = {"trials": 2, "max_concurrent": 2, "n_iters": 3000, "eval_every": 1000}
    steps = 2 * 3000
    monkeypatch.setattr(cost, "resources", lambda address: ("this machine", {"CPU": 4}, [{"CPU": 4}]))
    study = load_study(write(tmp_path, with_(budget=budget, tracking={"uri": uri})))
    lines = list(cost.describe_cost(study, calibrate=False))
    stored_step_rates(
        uri, [("ndr", "arithmetic", "cpu", 10.0)], stacked=4
    )  # a stack of 4: 40 member-steps/s, 4 runs at 40
    assert sorted(r["rate"] for r in step_rates(uri) if r["task"] == "arithmetic") == [40.0] * 4
    # Each trial evaluates 3 times (at 1,000, 2,000 and 3,000 steps), priced at the same rate.
    ndr_eval, lstm_eval = evaluating(study, "fwd__ndr", 1 / 2.0), evaluating(study, "fwd__lstm", 1 / 4.0)
    ndr = steps / statistics.median([1.0, 2.0, 10.0]) + 2 * ndr_eval
    lstm = steps / statistics.median([3.0, 5.0]) + 2 * lstm_eval
    assert lines == [
        "  cost of fwd__ndr: 2 trials x 3,000 steps = 6,000 training steps; 2.0 steps/s (from 3 earlier "
        f"trials of ndr on ctl on cpu); 3 evaluation(s) a trial, at most {cost.hours(ndr_eval)} -> at most "
        f"{cost.hours(ndr)} of trial time",
        "  cost of fwd__lstm: 2 trials x 3,000 steps = 6,000 training steps; 4.0 steps/s (from 2 earlier "
        f"trials of lstm (other tasks) on cpu); 3 evaluation(s) a trial, at most {cost.hours(lstm_eval)} -> "
        f"at most {cost.hours(lstm)} of trial time",
        f"  cost in all: 12,000 training steps = {cost.resource_hours(ndr + lstm)} CPU core-hours; on "
        f"this machine (4 CPUs, 4 trial(s) at once) at most {cost.hours(ndr / 2)} (tests priced at every "
        "evaluation; ASHA stops poor trials sooner)",  # ndr's 2 trials at once, not 4
    ]
    # Trials that get half a GPU each on a cluster of 2 GPUs: 4 at once, the rates of earlier trials on GPUs.
    monkeypatch.setattr(
        cost,
        "resources",
        lambda address: ("the cluster at head:6379", {"CPU": 16, "GPU": 2}, [{"CPU": 16, "GPU": 2}]),
    )
    on_gpus = with_(
        budget={**budget, "max_concurrent": 8, "trials": 8},
        resources={"cpu": 1, "gpu": 0.5},
        tracking={"uri": uri},
    )
    lines = list(
        cost.describe_cost(load_study(write(tmp_path, on_gpus)), calibrate=False, address="head:6379")
    )
    ndr = 8 * 3000 / 500.0
    # No earlier LSTM trial on a GPU: the cost model prices it (tests/test_cost_model.py).
    assert " steps/s by the cost model from lstm on ctl: " in lines[1], lines[1]
    assert (
        lines[2].startswith("  cost in all: 48,000 training steps = ")
        and lines[2].endswith("(tests priced at every evaluation; ASHA stops poor trials sooner)")
        and " GPU-hours; on the cluster at head:6379 (16 CPUs, 2 GPUs, 4 trial(s) at once) at most "
        in lines[2]
    ), lines[2]  # every pair priced: none left out


def test_the_plan_says_where_asha_could_stop_no_trial(tmp_path):
    """ASHA's first rung is at grace_period: a pair whose trials end by then is searched without
    early stopping, which the file asked for; the plan says so for that pair only."""
    from orchestrator.cli.describe import describe_study

    spec = with_(
        budget={"trials": 2},
        scheduler={"name": "asha", "grace_period": 600},
        per_model={"ndr": {"fixed": {"n_iters": 600}}, "lstm": {"fixed": {"n_iters": 1500}}},
    )
    plan = describe_study(load_study(write(tmp_path, spec))).splitlines()
    assert plan[1].endswith(
        "; ASHA stops none of its trials: they end at 600 iterations, within scheduler.grace_period 600"
    )
    assert "ASHA" not in plan[2]
    for quiet in (
        {**spec, "scheduler": {"name": "fifo"}},
        {**spec, "grid": {"dropout": [0.1, 0.2]}, "space": {}, "seeds": [0]},
    ):
        assert "ASHA" not in describe_study(load_study(write(tmp_path, quiet)))


def test_the_plan_says_where_each_pairs_training_comes_from_and_where_a_tasks_models_differ(tmp_path):
    """A model without a paper's preset (one of one's own) trains at the training defaults where the
    baselines beside it take their papers' values: the plan lists, per pair, the protocol keys from
    its preset and those at the defaults, and one line per task where they differ; `fixed` evens them."""
    from orchestrator.cli.describe import describe_study

    own = f"{ROOT / 'examples' / 'my_model.py'}:RelBiasTransformer"
    spec = {
        "metric": "best_ood_valid_token_acc",
        "tasks": [{"task": "copy", "options": {"eval_size": 16}}],
        "models": [own, "panm", "lstm_seq2seq"],
        "budget": {"trials": 1, "n_iters": 300},
        "fixed": {"optimizer": "adamw", "d_model": 32},
        "space": {"lr": {"loguniform": [1e-3, 5e-3]}},
    }
    study = load_study(write(tmp_path, spec))
    mine, panm, _ = study.pairs
    # RMSprop's momentum and alpha are left out where the optimizer is AdamW.
    assert panm.from_preset == {
        "batch_size": 128,
        "grad_clip": 10,
        "grad_clip_by": "value",
        "eval_every": 200,
    }
    assert mine.from_preset == {} and mine.from_defaults == {
        "lr_schedule": "constant",
        "weight_decay": 0.0,
        "batch_size": 512,
        "length_bucketed": False,
        "grad_clip": 5.0,
        "grad_clip_by": "norm",
        "eval_every": 1000,
    }
    plan = describe_study(study).splitlines()
    assert (
        "  training of copy__panm: from its paper's preset: batch_size=128, grad_clip=10, "
        "grad_clip_by=value, eval_every=200; at the training defaults: lr_schedule=constant, "
        "weight_decay=0.0, length_bucketed=false" in plan
    ), plan
    assert (
        "  training of copy__RelBiasTransformer: from its paper's preset: none; at the training defaults: "
        "lr_schedule=constant, weight_decay=0.0, batch_size=512, length_bucketed=false, grad_clip=5.0, "
        "grad_clip_by=norm, eval_every=1000" in plan
    ), plan
    assert (
        "  copy: its models train unlike: batch_size 512 (RelBiasTransformer) at the defaults, 128 (panm, "
        "lstm_seq2seq) from their papers; grad_clip 5.0 (RelBiasTransformer) at the defaults, 10 (panm, "
        "lstm_seq2seq) from their papers; grad_clip_by norm (RelBiasTransformer) at the defaults, value "
        "(panm, lstm_seq2seq) from their papers; eval_every 1000 (RelBiasTransformer) at the defaults, 200 "
        "(panm, lstm_seq2seq) from their papers (`fixed:` sets one for all)"
    ) in plan, plan
    evened = {**spec, "fixed": {**spec["fixed"], "batch_size": 128, "grad_clip": 1, "grad_clip_by": "norm"}}
    evened["budget"] = {**spec["budget"], "eval_every": 100}
    study = load_study(write(tmp_path, evened))
    assert study.unlike_training("copy") == {} and "train unlike" not in describe_study(study)
    assert study.pairs[1].from_preset == {}  # every protocol key the file's


def test_the_plan_says_which_of_a_files_keys_an_ablation_does_not_use(tmp_path):
    """A search turned into an ablation (a grid or seeds added) keeps its budget.trials and its
    scheduler, which an ablation ignores: said in the plan, not refused."""
    from orchestrator.cli.describe import describe_study

    spec = with_(scheduler={"name": "asha", "grace_period": 5}, seeds=[0, 1], space={})
    plan = describe_study(load_study(write(tmp_path, spec))).splitlines()
    assert plan[-2:] == [
        "  unused: budget.trials: a search's count of trials; an ablation trains every "
        "grid cell with every seed",
        "  unused: scheduler: a search's early stopping; an ablation trains every trial to its end",
    ]
    search = {k: v for k, v in spec.items() if k != "seeds"} | {"space": GOOD["space"]}
    assert "unused" not in describe_study(load_study(write(tmp_path, search)))
    assert "unused" not in describe_study(
        load_study(write(tmp_path, {k: v for k, v in spec.items() if k not in ("budget", "scheduler")}))
    )


def test_a_model_may_ask_for_its_own_share_of_the_resources(tmp_path, monkeypatch):
    """per_model.<model>.resources: its keys over the file's. Each trial asks Ray for its pair's
    (Tune's resource request of the trial's config), the cluster runs as many at once as the
    smallest trials allow, and the dry run sums each pair's GPU-hours at its own share: whole GPUs
    for a stacked NDR, a quarter for an LSTM."""
    from orchestrator.cli.describe import describe_study
    from orchestrator.run import cost
    from orchestrator.run.search import PAIR_KEY
    from orchestrator.run.tuner import SEARCH, make_trainable

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    stored_step_rates(uri, [("ndr", "ctl", "cuda:0", 100.0), ("lstm", "ctl", "cuda:0", 200.0)])
    study = load_study(
        write(
            tmp_path,
            with_(
                resources={"cpu": 4, "gpu": 1, "custom": {"slot": 1}},
                tracking={"uri": uri},
                per_model={"lstm": {"resources": {"cpu": 2, "gpu": 0.25}}},
            ),
        )
    )
    pairs = {p.model: p for p in study.pairs}
    assert (pairs["ndr"].resources.cpu, pairs["ndr"].resources.gpu) == (4, 1) and pairs[
        "lstm"
    ].resources.custom == {"slot": 1}
    assert pairs["lstm"].resources.asks(True) == {"CPU": 2, "GPU": 0.25, "slot": 1}
    assert pairs["lstm"].resources.asks(False) == {"CPU": 2, "slot": 1}  # no GPU where trials get none
    plan = describe_study(study).splitlines()
    unstopped = (
        "; ASHA stops none of its trials: they end at 10 iterations, within scheduler.grace_period 5000"
    )
    assert plan[1] == (
        "  pair fwd__ndr: searching lr, n_heads; one TPE suggestion per trial: stacked suggestions would "
        f"share n_heads, one value a stack (budget.stack_size K stacks them anyway){unstopped}"
    )
    assert plan[2] == f"  pair fwd__lstm: searching lr{unstopped}; each trial 2 CPU, 0.25 GPU, 1 slot"
    trainable = make_trainable(study, use_gpu=True, phase=SEARCH)
    assert trainable.default_resource_request({PAIR_KEY: "fwd__lstm"}).bundles == [
        {"CPU": 2, "GPU": 0.25, "slot": 1}
    ]
    assert trainable.default_resource_request({PAIR_KEY: "fwd__ndr"}).bundles == [
        {"CPU": 4, "GPU": 1, "slot": 1}
    ]
    # One GPU and 16 CPUs hold 4 LSTM trials at once (the pairs' limits allow 1 + 1 = 2).
    assert slots_in(decide(study, True), {"CPU": 16, "GPU": 1, "slot": 8}, True) == 2
    study = dataclasses.replace(study, budget=dataclasses.replace(study.budget, max_concurrent=8))
    assert slots_in(decide(study, True), {"CPU": 16, "GPU": 1, "slot": 8}, True) == 4

    monkeypatch.setattr(
        cost,
        "resources",
        lambda address: (
            "the cluster at head:6379",
            {"CPU": 16, "GPU": 1, "slot": 8},
            [{"CPU": 16, "GPU": 1, "slot": 8}],
        ),
    )
    lines = list(cost.describe_cost(study, calibrate=False, address="head:6379"))
    # 2 trials x 10 steps each, and their 2 evaluations
    ndr = 2 * (10 / 100.0 + evaluating(study, "fwd__ndr", 1 / 100.0))
    lstm = 2 * (10 / 200.0 + evaluating(study, "fwd__lstm", 1 / 200.0))
    gpu_seconds = ndr * 1 + lstm * 0.25
    # The whole-GPU NDR trials cannot share the one GPU: its busy time bounds the wall time.
    assert lines[2] == (
        f"  cost in all: 40 training steps = {cost.resource_hours(gpu_seconds)} GPU-hours; on the cluster at "
        f"head:6379 (16 CPUs, 1 GPUs, 4 trial(s) at once) at most {cost.hours(ndr + lstm * 0.25)} "
        "(tests priced at every evaluation; ASHA stops poor trials sooner)"
    )


def test_a_trial_of_a_model_no_node_can_hold_is_refused_by_its_own_key(tmp_path, monkeypatch):
    import ray

    from orchestrator.run.preflight import ClusterMismatch, check_fits

    study = load_study(
        write(tmp_path, with_(resources={"cpu": 1}, per_model={"ndr": {"resources": {"gpu": 1}}}))
    )
    monkeypatch.setattr(ray, "nodes", lambda: [{"Alive": True, "Resources": {"CPU": 4.0, "GPU": 0.5}}])
    with pytest.raises(
        ClusterMismatch,
        match=r"^per_model\.ndr\.resources\.gpu: a trial asks for 1 GPU; no node of the cluster has that "
        r"much \(the most on one node: 0\.5\)$",
    ):
        check_fits(study, use_gpu=True)
    check_fits(study, use_gpu=False)  # where trials get no GPU, they ask for none
    # The model's entry sets only its GPU: a CPU count no node has is the file's key.
    study = load_study(
        write(
            tmp_path,
            with_(
                models=["lstm"],
                space={"lr": {"loguniform": [1e-4, 1e-3]}},
                resources={"cpu": 8},
                per_model={"lstm": {"resources": {"gpu": 0.25}}},
            ),
        )
    )
    with pytest.raises(ClusterMismatch, match=r"^resources\.cpu: a trial asks for 8 CPU"):
        check_fits(study, use_gpu=True)


def test_a_dry_run_names_the_trials_a_cluster_cannot_hold_and_prices_them_all_the_same(tmp_path, monkeypatch):
    """The launch would refuse; the dry run is for planning a cluster that will hold them, so it says
    why, with the key, and still gives the hours (README: --dry-run checks what a launch checks)."""
    from orchestrator.run import cost

    study = load_study(
        write(tmp_path, with_(resources={"cpu": 1}, per_model={"ndr": {"resources": {"gpu": 1}}}))
    )
    node = {"CPU": 4.0, "GPU": 0.5}
    monkeypatch.setattr(
        cost,
        "resources",
        lambda address: ("the cluster at head:6379", {"CPU": 8.0, "GPU": 1.0}, [node, node]),
    )
    lines = list(cost.describe_cost(study, calibrate=False, address="head:6379"))
    assert lines[0] == (
        "  a launch on the cluster at head:6379 would be refused: per_model.ndr.resources.gpu: a trial asks "
        "for 1 GPU; no node of the cluster has that much (the most on one node: 0.5)"
    )
    assert len(lines) == 1 + len(study.pairs) + 1 and lines[-1].startswith("  cost in all:")
    # Calibrating on that cluster: a task for the trials no node holds would wait for none; the others
    # are timed there.
    timed = []
    monkeypatch.setattr(
        cost.Calibration,
        "submit",
        lambda self, pair, device, measure, *args: timed.append((pair.name, measure.__name__)),
    )
    monkeypatch.setattr(
        cost.Calibration, "result", lambda self, pair, device, measure, *args: (0.01, "on node-1")
    )
    monkeypatch.setattr(cost, "launch_stack_size", lambda *args: 1)
    lines = list(cost.describe_cost(study, calibrate=True, address="head:6379"))
    assert timed == [("fwd__lstm", "seconds_per_step")]  # submitted before any is awaited
    assert (
        lines[1].endswith("not timed: no node of the cluster holds its trials (above)")
        and "0.010 s per step on node-1" in lines[2]
    ), lines


def test_a_stack_size_is_timed_on_a_whole_gpu_even_where_trials_share_one(tmp_path, monkeypatch):
    """Curves timed side by side on one GPU time each other: each calibration asks for a whole GPU
    (and so runs alone on it), or for the most a node has where no node has a whole one."""
    import ray

    from orchestrator.run import preflight

    asked = []

    class Timed:
        def options(self, **options):
            asked.append(options["num_gpus"])
            return self

        def remote(self, flat, sizes):
            return sizes

    monkeypatch.setattr(preflight, "measurement", lambda function, **resources: Timed().options(**resources))
    monkeypatch.setattr(ray, "get", lambda sizes: [(n, 10.0 * n) for n in sizes])
    stacking = decide(
        load_study(
            write(
                tmp_path, with_(models=["ndr"], space={}, seeds=[0, 1, 2], resources={"cpu": 1, "gpu": 0.25})
            )
        ),
        True,
    )
    for gpus, expected in ((2.0, 1), (0.5, 0.5)):
        monkeypatch.setattr(ray, "nodes", lambda: [{"Alive": True, "Resources": {"CPU": 4.0, "GPU": gpus}}])
        asked.clear()
        assert preflight.measure_stack_sizes(stacking) == {"fwd__ndr": 3} and asked == [expected]


def test_the_plan_says_a_search_stacks_where_trials_get_a_gpu(tmp_path):
    """The plan is printed before the launch knows its GPUs (batch_seeds auto): a search that would
    stack its suggestions on GPUs says so, hedged; one whose trials ask for no GPU says nothing."""
    from orchestrator.cli.describe import describe_study

    space = {"lr": {"loguniform": [1e-4, 1e-3]}, "weight_decay": {"uniform": [0.0, 0.1]}}
    study = load_study(
        write(
            tmp_path,
            with_(
                models=["ndr"],
                space=space,
                budget={"trials": 8, "stack_size": 4},
                resources={"cpu": 1, "gpu": 1},
            ),
        )
    )
    assert (
        "pair fwd__ndr: searching lr, weight_decay; 4 TPE suggestions per trial, stacked (each with its own "
        "lr, weight_decay), where trials get a GPU (batch_seeds: auto)"
    ) in describe_study(study)
    on_cpus = load_study(
        write(tmp_path, with_(models=["ndr"], space=space, budget={"trials": 8, "stack_size": 4}))
    )
    assert "TPE suggestions per trial" not in describe_study(on_cpus)
    # auto: before the launch measures, the plan says the stack size is the launch's to find; a
    # space that varies shape keys too does not stack (one value of them a stack) and says why.
    auto = load_study(
        write(
            tmp_path, with_(models=["ndr"], space=space, budget={"trials": 8}, resources={"cpu": 1, "gpu": 1})
        )
    )
    assert (
        "pair fwd__ndr: searching lr, weight_decay; TPE suggestions stacked per trial, as many as the launch "
        "measures pays (budget.stack_size auto; each with its own lr, weight_decay), where trials get "
        "a GPU (batch_seeds: auto)"
    ) in describe_study(auto)
    shapes = load_study(
        write(
            tmp_path,
            with_(
                models=["ndr"],
                space={**space, "n_heads": {"choice": [1, 2]}},
                budget={"trials": 8},
                resources={"cpu": 1, "gpu": 1},
            ),
        )
    )
    assert (
        "pair fwd__ndr: searching lr, n_heads, weight_decay; one TPE suggestion per trial: stacked "
        "suggestions would share n_heads, one value a stack (budget.stack_size K stacks them anyway)"
    ) in describe_study(shapes)


def test_a_stack_size_is_timed_on_a_config_that_stacks(tmp_path, monkeypatch):
    """The throughput curve times a config whose members stack: an ablation's largest stacking
    group (its first cell, act: graves, cannot), a search's typical config with a choice that lets
    it stack (the middle of [none, graves] is graves). A search whose space varies `act` stacks only
    with a stack_size of the file's (act is one value a stack), so only the dry run times it."""
    import ray

    from orchestrator.run import cost, preflight

    timed = []

    class Timed:
        def options(self, **options):
            return self

        def remote(self, flat, sizes):
            timed.append(flat)
            return sizes

    monkeypatch.setattr(preflight, "measurement", lambda function, **resources: Timed().options(**resources))
    monkeypatch.setattr(ray, "get", lambda sizes: [(n, 10.0 * n) for n in sizes])
    monkeypatch.setattr(ray, "nodes", lambda: [{"Alive": True, "Resources": {"CPU": 4.0, "GPU": 1.0}}])
    ablation = decide(
        load_study(
            write(
                tmp_path,
                with_(
                    models=["ndr"],
                    space={},
                    grid={"act": ["graves", "none"]},
                    seeds=[0, 1, 2],
                    resources={"cpu": 1, "gpu": 1},
                ),
            )
        ),
        True,
    )
    assert preflight.measure_stack_sizes(ablation) == {
        "fwd__ndr": ablation.most_stacked(ablation.study.pairs[0])
    }
    assert [flat["act"] for flat in timed] == ["none"]
    search = with_(
        models=["ndr"],
        space={"lr": {"loguniform": [1e-4, 1e-3]}, "act": {"choice": ["none", "graves"]}},
        budget={"trials": 4, "n_iters": 10},
        resources={"cpu": 1, "gpu": 1},
    )
    auto = decide(load_study(write(tmp_path, search)), True)
    assert preflight.measure_stack_sizes(auto) == {} and auto.most_stacked(auto.study.pairs[0]) == 1
    given = decide(
        load_study(write(tmp_path, {**search, "budget": {**search["budget"], "stack_size": 4}})), True
    )
    pair = given.study.pairs[0]
    assert (
        given.search_stack(pair) == 4 and cost.calibration_config(given, pair, stacked=True)["act"] == "none"
    )


def test_a_gpu_node_whose_torch_finds_no_cuda_is_said_before_the_launch(tmp_path, monkeypatch, capsys):
    """Its trials would hold a GPU and train on the CPU (device auto), many times slower: the launch
    asks one GPU of the cluster and warns (a GPU declared to Ray on a CPU machine is no error: the
    cluster tests run so). Pairs whose trials get no GPU ask nothing."""
    import ray

    from orchestrator.run import preflight

    asked = []

    class Asked:
        def options(self, **options):
            asked.append(options)
            return self

        def remote(self):
            return "ref"

    answer = {"available": False, "torch": "2.13.0+cpu", "cuda": None, "node": "gpu-node-1"}
    monkeypatch.setattr(preflight, "measurement", lambda function, **resources: Asked().options(**resources))
    monkeypatch.setattr(ray, "get", lambda ref, timeout: answer)
    monkeypatch.setattr(ray, "nodes", lambda: [{"Alive": True, "Resources": {"CPU": 16.0, "GPU": 8.0}}])
    study = load_study(write(tmp_path, with_(resources={"cpu": 4, "gpu": 0.25})))
    preflight.check_cuda(study)
    assert capsys.readouterr().out == (
        "[launch] warning: on gpu-node-1, a node with GPUs, torch 2.13.0+cpu finds no CUDA (a CPU-only "
        "build): trials that hold a GPU there train on its CPU; install a CUDA build "
        "of torch on the GPU nodes\n"
    )
    assert asked == [{"num_cpus": 4, "num_gpus": 1}]
    assert "built for CUDA 13.0; the driver or the GPU does not answer" in preflight.without_cuda(
        {**answer, "cuda": "13.0"}
    )
    assert preflight.without_cuda({**answer, "available": True}) is None
    asked.clear()
    preflight.check_cuda(load_study(write(tmp_path, GOOD)))  # no GPU asked for
    assert asked == [] and capsys.readouterr().out == ""


def test_a_launch_on_cuda_is_refused_where_the_cluster_has_no_gpu(tmp_path):
    """A file that names CUDA as its trials' device, launched on a cluster without GPUs (this
    machine's own Ray instance): one line naming the key, exit 2, before a launch folder or a
    store exists, not a failure at every trial's first step."""
    path = write(tmp_path, with_(resources={"gpu": 1}, per_model={"ndr": {"fixed": {"device": "cuda"}}}))
    out = run_cli("launch", str(path), cwd=tmp_path)
    assert out.returncode == 2, out.stdout + out.stderr
    assert (
        out.stderr.strip() == f"orchestrator: error: {path}: per_model.ndr.fixed.device: cuda needs a "
        "GPU, and the cluster has none"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["space.yaml"]


def test_dry_run_without_calibration_creates_no_store(tmp_path):
    uri = f"sqlite:///{tmp_path}/store/mlflow.db"
    out = run_cli(
        "launch",
        str(write(tmp_path, with_(tracking={"uri": uri}))),
        "--dry-run",
        "--no-calibrate",
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    assert " steps/s by the cost model from ndr on ctl: " in out.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["space.yaml"]
    from orchestrator.record.runs import step_rates

    empty = tmp_path / "empty.db"  # a database without MLflow's tables gets none
    empty.touch()
    assert step_rates(f"sqlite:///{empty}") == [] and empty.stat().st_size == 0


@pytest.mark.long  # 53 s; test_service's planted password is checked in every file, record and output
def test_a_password_in_the_tracking_uri_is_never_printed(tmp_path):
    """The local PostgreSQL trusts every login, so a planted password connects and must not show;
    on the command line, where `ps` would show it, it is refused."""
    secret = "planted-Pa55word"
    in_userinfo = f"postgresql+psycopg://postgres:{secret}@127.0.0.1:5432/test"
    in_query = f"postgresql+psycopg://postgres@127.0.0.1:5432/test?password={secret}"
    unanswered = [uri.replace(":5432/", ":1/") for uri in (in_userinfo, in_query)]
    for uri in (in_userinfo, in_query, *unanswered):
        out = run_cli(
            "launch",
            str(write(tmp_path, GOOD)),
            "--dry-run",
            "--no-calibrate",
            cwd=tmp_path,
            env_extra={"MLFLOW_TRACKING_URI": uri, "SYSGEN_STORE_RETRY_S": "0"},
        )
        assert out.returncode in (0, 4) and (
            "postgres:***@127.0.0.1" in out.stdout + out.stderr or "password=***" in out.stdout + out.stderr
        )
        assert secret not in out.stdout + out.stderr
    for uri in (in_userinfo, in_query):  # refused before anything connects
        out = run_cli("launch", str(write(tmp_path, GOOD)), "--dry-run", "--tracking-uri", uri, cwd=tmp_path)
        assert out.returncode == 2 and out.stderr.strip() == (
            "orchestrator: error: --tracking-uri: holds a password, which `ps` shows every "
            "user of this machine for as long as the launch runs; set MLFLOW_TRACKING_URI to this URI instead"
        )


@pytest.mark.long
def test_a_value_refused_for_its_shape_is_not_echoed_with_its_secrets(tmp_path):
    """A refusal quotes the value it refuses: a URI with a scheme we do not take, a tracking section
    written as a bare URI, a storage mapping holding a key, an endpoint holding credentials."""
    secret = "planted-Pa55word"
    cases = {
        "tracking.uri: expected sqlite:///..., postgresql://..., mysql://... or "
        "http(s)://..., got a postgres:// URI": {
            **GOOD,
            "tracking": {"uri": f"postgres://alice:{secret}@127.0.0.1/test"},
        },
        "tracking.uri: expected sqlite:///..., postgresql://..., mysql://... or "
        "http(s)://..., got no scheme://": {
            **GOOD,
            "tracking": {"uri": f"alice:{secret}@127.0.0.1/test"},
        },  # no scheme: no pattern finds the password
        "tracking: expected a mapping": {**GOOD, "tracking": f"postgresql://alice:{secret}@127.0.0.1/test"},
        "storage: expected": {
            **GOOD,
            "storage": {"endpoint": "http://minio:9000", "aws_secret_access_key": secret},
        },
        "storage: endpoint: credentials": {
            **GOOD,
            "storage": {"uri": "s3://bucket/runs", "endpoint": f"http://minio:{secret}@minio:9000"},
        },
    }
    for reason, data in cases.items():
        path = write(tmp_path, data)
        out = run_cli("launch", str(path), "--dry-run", "--no-calibrate", cwd=tmp_path)
        assert out.returncode == 2 and out.stderr.startswith(f"orchestrator: error: {path}: {reason}"), (
            out.stderr
        )
        assert secret not in out.stdout + out.stderr and (
            "***" in out.stderr or "endpoint" in reason or "tracking.uri" in reason
        ), out.stderr


def test_a_key_named_like_a_secret_is_refused_in_words_not_masked(tmp_path):
    """The redaction took `password: no` of the refusal for a secret's value and printed
    `fixed.password: '***' model in this file ...`; the file and key are printed as they are."""
    path = write(tmp_path, {**GOOD, "fixed": {"password": "planted-Pa55word"}})
    out = run_cli("launch", str(path), "--dry-run", "--no-calibrate", cwd=tmp_path)
    assert out.returncode == 2 and out.stderr.startswith(
        f"orchestrator: error: {path}: fixed.password: no model in this file has this parameter"
    ), out.stderr
    assert "planted-Pa55word" not in out.stdout + out.stderr


@pytest.mark.long
def test_an_unreachable_address_or_unwritable_storage_is_refused_within_seconds(tmp_path):
    out = run_cli("launch", str(write(tmp_path, GOOD)), "--dry-run", "--address", "127.0.0.1:1", cwd=tmp_path)
    assert out.returncode == 2 and out.stderr.startswith(
        "orchestrator: error: --address: no Ray cluster answers at 127.0.0.1:1"
    )
    # A port that accepts and never answers (ray.init waited there past 300 s).
    with socket.create_server(("127.0.0.1", 0)) as silent:
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        out = run_cli("launch", str(write(tmp_path, GOOD)), "--dry-run", "--address", address, cwd=tmp_path)
    assert out.returncode == 2 and out.stderr == (
        f"orchestrator: error: --address: {address} accepted a connection but sent nothing "
        "back within 5 s: no Ray cluster answers there\n"
    ), out.stderr
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    out = run_cli(
        "launch",
        str(write(tmp_path, with_(storage_path=str(blocker / "runs")))),
        "--dry-run",
        "--no-calibrate",
        cwd=tmp_path,
    )
    assert out.returncode == 2 and "storage_path: cannot create launch folders" in out.stderr
    assert not (tmp_path / "runs").exists()
    # A folder root may write by os.access (this machine's tests run as root) that takes no file.
    out = run_cli(
        "launch",
        str(write(tmp_path, with_(storage_path="/proc/runs"))),
        "--dry-run",
        "--no-calibrate",
        cwd=tmp_path,
    )
    assert (
        out.returncode == 2
        and "storage_path: cannot create launch folders in /proc/runs (/proc is not a writable folder"
        in out.stderr
    )


def test_seeds_batch_into_one_trial_per_cell_where_the_model_allows(tmp_path):
    """An ablation's NDR cells train their seeds in one trial (trainables.batched); the LSTM's, whose
    forward packs sequences on the host, one trial per seed; `batch_seeds: false` turns it off, and a
    confirmation batches each candidate's seeds the same way."""
    from types import SimpleNamespace

    from orchestrator.run.tuner import CONFIRM, SEARCH, phase_cells

    ablation = with_(space={}, grid={"n_layers": [1, 2]}, seeds=[0, 1, 2], batch_seeds=True)
    study = load_study(write(tmp_path, ablation))
    cells = phase_cells(decide(study, False), None, SEARCH)
    assert cells["fwd__ndr"] == [{"n_layers": n, "members": [{"seed": s} for s in (0, 1, 2)]} for n in (1, 2)]
    assert cells["fwd__lstm"] == [{"n_layers": n, "seed": s} for n in (1, 2) for s in (0, 1, 2)]
    # What the cluster's slots and the dry run's estimate count: Tune trials, not seeds.
    counts = {p.name: (decide(study, False).tune_trial_count(p), study.trial_count(p)) for p in study.pairs}
    assert counts == {"fwd__ndr": (2, 6), "fwd__lstm": (6, 6)}
    unbatched = phase_cells(
        decide(load_study(write(tmp_path, {**ablation, "batch_seeds": False})), True), None, SEARCH
    )
    assert unbatched["fwd__ndr"] == [{"n_layers": n, "seed": s} for n in (1, 2) for s in (0, 1, 2)]
    act = phase_cells(
        decide(load_study(write(tmp_path, {**ablation, "grid": {"act": ["none", "graves"]}})), False),
        None,
        SEARCH,
    )["fwd__ndr"]
    assert act == [{"act": "none", "members": [{"seed": s} for s in (0, 1, 2)]}] + [
        {"act": "graves", "seed": s} for s in (0, 1, 2)
    ]

    search = decide(
        load_study(write(tmp_path, with_(confirm={"top_k": 1, "seeds": [5, 6]}, batch_seeds=True))), False
    )
    state = SimpleNamespace(
        candidates={"fwd__ndr": [{"lr": 1e-3, "seed": 0}], "fwd__lstm": [{"lr": 1e-3, "seed": 0}]}
    )
    confirm = phase_cells(search, state, CONFIRM)
    assert confirm["fwd__ndr"] == [
        {"lr": 1e-3, "seed": 0, "candidate": 0, "members": [{"lr": 1e-3, "seed": 5}, {"lr": 1e-3, "seed": 6}]}
    ]
    assert confirm["fwd__lstm"] == [{"lr": 1e-3, "candidate": 0, "seed": s} for s in (5, 6)]
    assert phase_cells(search, state, SEARCH) is None


def test_cells_that_differ_only_in_what_members_may_have_of_their_own_share_a_stack(tmp_path):
    """Issue 21 item 3: every seed of every cell whose model shape is the same, differing in learning
    rate, weight decay or clipping, trains in one trial; a shape key (n_layers) starts another. A
    member's config keeps the grid's key order (its run's `cell` tag is the planned one)."""
    from orchestrator.run.search import member_config
    from orchestrator.run.tuner import SEARCH, phase_cells

    ablation = with_(
        space={},
        grid={"n_layers": [1, 2], "lr": [1e-3, 3e-3], "weight_decay": [0.0, 0.1]},
        seeds=[0, 1],
        batch_seeds=True,
    )
    stacking = decide(load_study(write(tmp_path, ablation)), False)
    study, trials = stacking.study, phase_cells(stacking, None, SEARCH)["fwd__ndr"]
    assert [t["n_layers"] for t in trials] == [1, 2]
    assert trials[1]["members"] == [
        {"lr": lr, "weight_decay": wd, "seed": s} for lr in (1e-3, 3e-3) for wd in (0.0, 0.1) for s in (0, 1)
    ]
    assert list(member_config(trials[1], 5)) == [*study.pairs[0].grid, "seed"]
    assert member_config(trials[1], 5) == {"n_layers": 2, "lr": 3e-3, "weight_decay": 0.0, "seed": 1}
    assert {p.name: (stacking.tune_trial_count(p), study.trial_count(p)) for p in study.pairs} == {
        "fwd__ndr": (2, 16),
        "fwd__lstm": (16, 16),
    }
    assert "stacked: 2 trial(s) train its 16 runs" in stacking.seed_batching(study.pairs[0])
    one = phase_cells(
        decide(load_study(write(tmp_path, {**ablation, "grid": {"n_layers": [1]}, "seeds": [3]})), False),
        None,
        SEARCH,
    )["fwd__ndr"]
    assert one == [{"n_layers": 1, "seed": 3}]  # a stack of one is a plain trial


def test_batch_seeds_auto_batches_where_trials_get_a_gpu(tmp_path):
    """On CPUs a stacked model of N seeds steps slower than N runs in turn
    (docs/performance.md#cpu-stacked-seeds-against-separate-runs): the default batches only trials
    that get a GPU."""
    from orchestrator.run.tuner import SEARCH, phase_cells

    ablation = with_(space={}, grid={"n_layers": [1, 2]}, seeds=[0, 1])
    auto = load_study(write(tmp_path, ablation))
    assert "seeds batched where trials get a GPU (batch_seeds: auto)" in decide(auto, None).seed_batching(
        auto.pairs[0]
    )
    for gpus, per_trial_gpu, batched in ((False, 0.25, False), (True, 0.25, True), (True, 0, False)):
        stacking = decide(
            load_study(write(tmp_path, {**ablation, "resources": {"cpu": 1, "gpu": per_trial_gpu}})), gpus
        )
        assert ("members" in phase_cells(stacking, None, SEARCH)["fwd__ndr"][0]) is batched, (
            gpus,
            per_trial_gpu,
        )
    # A model whose own trials get no GPU on a cluster with GPUs trains one trial per seed.
    study = load_study(
        write(
            tmp_path,
            {
                **ablation,
                "models": ["ndr", "transformer"],
                "resources": {"cpu": 1, "gpu": 0.5},
                "per_model": {"transformer": {"resources": {"gpu": 0}}},
            },
        )
    )
    stacking = decide(study, True)
    cells = phase_cells(stacking, None, SEARCH)
    assert "members" in cells["fwd__ndr"][0] and "members" not in cells["fwd__transformer"][0]
    assert (
        stacking.seed_batching(study.pairs[1])
        == "1 trial per seed: batch_seeds: auto, and per_model.transformer.resources gives its trials no GPU"
    )
    with pytest.raises(SpecError, match="batch_seeds: must be true, false or auto"):
        load_study(write(tmp_path, with_(batch_seeds="yes")))


def test_stack_size_caps_a_stack_and_sets_how_many_suggestions_a_search_trial_trains(tmp_path):
    """budget.stack_size: an ablation's cell group is cut into trials of at most that many members;
    a search trial trains that many TPE suggestions where the model stacks and the space varies a
    member key (the LSTM does not stack: one suggestion per trial). auto with no measurement: a
    search stacks nothing, an ablation its whole group; measured, a search stacks where its space
    varies member keys only (its suggestions would share the rest, one value a stack)."""
    from orchestrator.run.tuner import SEARCH, phase_cells

    ablation = with_(
        space={},
        grid={"n_layers": [1], "lr": [1e-3, 3e-3]},
        seeds=[0, 1, 2],
        batch_seeds=True,
        budget={"stack_size": 4},
    )
    trials = phase_cells(decide(load_study(write(tmp_path, ablation)), False), None, SEARCH)["fwd__ndr"]
    assert [len(t["members"]) for t in trials] == [4, 2]
    assert [m for t in trials for m in t["members"]] == [
        {"lr": lr, "seed": s} for lr in (1e-3, 3e-3) for s in (0, 1, 2)
    ]
    # Five and one would train the last seed alone (on CUDA in TF32, where stacks train in bf16): four
    # and two.
    one_left = decide(load_study(write(tmp_path, {**ablation, "budget": {"stack_size": 5}})), False)
    assert [len(t["members"]) for t in phase_cells(one_left, None, SEARCH)["fwd__ndr"]] == [4, 2]
    assert [m for t in phase_cells(one_left, None, SEARCH)["fwd__ndr"] for m in t["members"]] == [
        m for t in trials for m in t["members"]
    ]

    search = decide(
        load_study(write(tmp_path, with_(budget={"trials": 10, "stack_size": 4}, batch_seeds=True))), False
    )
    assert {p.name: (search.search_stack(p), search.tune_trial_count(p)) for p in search.study.pairs} == {
        "fwd__ndr": (4, 3),
        "fwd__lstm": (1, 10),
    }
    shapes_only = load_study(
        write(
            tmp_path,
            with_(
                space={"n_heads": {"choice": [1, 2]}},
                budget={"trials": 10, "stack_size": 4},
                batch_seeds=True,
            ),
        )
    )
    assert (
        decide(shapes_only, False).search_stack(shapes_only.pairs[0]) == 1
    )  # suggestions that differ in shape cannot share a stack
    auto = load_study(
        write(
            tmp_path,
            with_(budget={"trials": 10}, batch_seeds=True, space={"lr": {"loguniform": [1e-4, 1e-3]}}),
        )
    )
    assert decide(auto, False).search_stack(auto.pairs[0]) == 1
    measured = decide(auto, False, {"fwd__ndr": 6})  # what a launch measured
    assert measured.search_stack(auto.pairs[0]) == 6 and measured.tune_trial_count(auto.pairs[0]) == 2
    shapes_too = load_study(write(tmp_path, with_(budget={"trials": 10}, batch_seeds=True)))  # lr and n_heads
    measured = decide(shapes_too, False, {"fwd__ndr": 6})
    assert measured.most_stacked(shapes_too.pairs[0]) == 1 and measured.search_stack(shapes_too.pairs[0]) == 1
    for bad in (0, "many", True):
        with pytest.raises(SpecError, match="budget.stack_size: "):
            load_study(write(tmp_path, with_(budget={"stack_size": bad})))


def test_a_confirmation_runs_as_many_trials_at_once_as_its_own_trials_allow(tmp_path, monkeypatch):
    """A search of 3 trials runs 3 at a time (a stacked one may be a single Tune trial); its
    confirmation repeats the top 3 over 2 seeds, 6 trials the cluster may run side by side."""
    import ray

    from orchestrator.run.tuner import CONFIRM, cluster_slots, phase_cells

    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 8})
    study = load_study(
        write(
            tmp_path,
            with_(
                models=["lstm"],
                space={"lr": {"loguniform": [1e-4, 1e-3]}},
                resources={"cpu": 1},
                budget={"trials": 3, "max_concurrent": 8},
                confirm={"top_k": 3, "seeds": [5, 6]},
            ),
        )
    )
    state = type("State", (), {"candidates": {"fwd__lstm": [{"lr": 1e-4}, {"lr": 2e-4}, {"lr": 3e-4}]}})()
    stacking = decide(study, False)
    assert cluster_slots(stacking, False) == 3
    assert cluster_slots(stacking, False, phase_cells(stacking, state, CONFIRM)) == 6


def test_dry_run_prices_stacked_trials_at_the_rate_of_a_stacks_members(tmp_path, monkeypatch):
    """Trials that get a GPU stack (batch_seeds auto): the estimate times the stack size a launch
    would use (here budget.stack_size 2) and prices every run at its member-steps/s. The GPU is
    pretended; the curve is this CPU's."""
    from orchestrator.run import cost

    monkeypatch.setattr(
        cost, "resources", lambda address: ("this machine", {"CPU": 2, "GPU": 1}, [{"CPU": 2, "GPU": 1}])
    )
    monkeypatch.setattr(cost, "cuda_here", lambda: True)
    study = load_study(
        write(
            tmp_path,
            with_(
                models=["ndr"],
                budget={"trials": 4, "n_iters": 10, "stack_size": 2},
                resources={"cpu": 1, "gpu": 1},
                fixed={"d_model": 16, "n_layers": 2, "batch_size": 8},
            ),
        )
    )
    monkeypatch.setenv("SYSGEN_DATA_CACHE", str(tmp_path / "cache"))
    line, summary = cost.describe_cost(study, calibrate=True)
    assert (
        line.startswith("  cost of fwd__ndr: 4 trials x 10 steps = 40 training steps; ")
        and "; stacks of 2: " in line
    ), line
    rate = float(line.split("stacks of 2: ")[1].split(" member-steps/s")[0])
    # The rate is printed to 0.1 and the time computed from the unrounded one; each of the 4 trials
    # (stacked 2 high, a member-step each) evaluates once, at its end.
    assert (
        any(
            line.endswith(
                f"-> at most {cost.hours(4 * (10 / r + evaluating(study, 'fwd__ndr', 1 / r)))} of trial time"
            )
            for r in (rate - 0.05, rate, rate + 0.05)
        )
        and " GPU-hours" in summary
    ), (line, summary)
    # The curve is timed uncompiled (a compile per size would take minutes) and says so where the
    # stacks will train compiled: compile: auto on CUDA, unless the file turns it off.
    assert (
        " member-steps/s here, uncompiled; they train compiled (compile: auto on CUDA), so "
        "the time is an upper bound" in line
    ), line
    uncompiled = load_study(
        write(
            tmp_path,
            with_(
                models=["ndr"],
                budget={"trials": 4, "n_iters": 10, "stack_size": 2},
                resources={"cpu": 1, "gpu": 1},
                fixed={"d_model": 16, "n_layers": 2, "batch_size": 8, "compile": False},
            ),
        )
    )
    line = next(cost.describe_cost(uncompiled, calibrate=True))
    assert "; stacks of 2: " in line and "uncompiled" not in line, line
    # A pair that does not stack (an LSTM; NDR with batch_seeds false) keeps its calibrated time.
    # Without stack_size the size is the curve's knee, so the curve is pinned: on loaded cores a
    # stack of 2 can time no faster per member than 1, and the knee would then be 1.
    monkeypatch.setattr(cost, "stack_curve", lambda flat, sizes: [(n, 10.0 * n) for n in sizes])
    study = load_study(
        write(
            tmp_path,
            with_(
                models=["ndr", "lstm"],
                budget={"trials": 2, "n_iters": 10},
                resources={"cpu": 1, "gpu": 1},
                space={"lr": {"loguniform": [1e-4, 1e-3]}},
                fixed={"d_model": 16, "n_layers": 2, "batch_size": 8},
            ),
        )
    )
    ndr, lstm, _ = cost.describe_cost(study, calibrate=True)
    assert "; stacks of 2: " in ndr and " s per step here; 1 evaluation(s) a trial, at most " in lstm, (
        ndr,
        lstm,
    )
    study = load_study(
        write(
            tmp_path,
            with_(
                models=["ndr"],
                budget={"trials": 2, "n_iters": 10},
                resources={"cpu": 1, "gpu": 1},
                batch_seeds=False,
                space={"lr": {"loguniform": [1e-4, 1e-3]}},
                fixed={"d_model": 16, "n_layers": 2, "batch_size": 8},
            ),
        )
    )
    line, _ = cost.describe_cost(study, calibrate=True)
    assert "stack" not in line, line
    # A stack is never more than the pair's runs: a search of 3 under stack_size 8 trains stacks of 3.
    study = load_study(
        write(
            tmp_path,
            with_(
                models=["ndr"],
                budget={"trials": 3, "n_iters": 10, "stack_size": 8},
                resources={"cpu": 1, "gpu": 1},
                fixed={"d_model": 16, "n_layers": 2, "batch_size": 8},
            ),
        )
    )
    line, summary = cost.describe_cost(study, calibrate=True)
    assert "; stacks of 3: " in line and ", 1 trial(s) at once)" in summary, (line, summary)
    # Trials that share a GPU were timed alone: their price says so (stored rates come from trials as
    # they shared: test_dry_run_without_calibration_estimates_from_stored_step_rates has no such words).
    study = load_study(
        write(
            tmp_path,
            with_(
                models=["ndr"],
                budget={"trials": 2, "n_iters": 10, "stack_size": 2},
                resources={"cpu": 1, "gpu": 0.5},
                fixed={"d_model": 16, "n_layers": 2, "batch_size": 8},
            ),
        )
    )
    line, summary = cost.describe_cost(study, calibrate=True)
    assert line.endswith(
        " of trial time if its trials did not slow each other (timed alone; they share a GPU, 0.5 each)"
    ), line
    assert summary.endswith(
        "; longer in fact: 1 pair(s) were timed alone though their trials share a GPU and slow each other"
    ), summary


def test_the_readmes_annotated_search_file_is_one_the_service_accepts():
    """The README's key-by-key example, as a user would copy it (a duplicated key once refused it)."""
    readme = Path(__file__).resolve().parent.parent / "README.md"
    example = re.search(r"```yaml\n(name: ctl .*?)```", readme.read_text(), re.S).group(1)
    study = load_study(readme, text=example)
    assert (
        study.budget.trials == 20
        and study.budget.stack_size == "auto"
        and {p.model for p in study.pairs} == {"lstm", "ndr"}
    )


# The inputs behind the user guide's table of refusals (docs/guide/searching.md) that a file alone
# causes, by the table's message.
REFUSALS_SHOWN = {
    "line 2: malformed YAML: duplicate key 'name'": "name: a\nname: b\n",
    "modles: unknown key (did you mean 'models'?); valid: ...": with_(modles=["ndr"]),
    "budget.n_iters: expected int or null, got 'many'": with_(budget={"n_iters": "many"}),
    "space.lr.loguniform: empty or inverted range [0.001, 5e-05]: low must be below high": with_(
        space={"lr": {"loguniform": [1e-3, 5e-5]}}
    ),
    "tasks[0].options: p_subexpression: must be a probability in [0, 1), got 1.5": with_(
        tasks=[{"task": "arithmetic", "options": {"p_subexpression": 1.5}}]
    ),
    "space.dropout=1.5 (fwd__ndr): dropout: must be at least 0 and less than 1, got 1.5": with_(
        space={"dropout": {"uniform": [0.0, 1.5]}}
    ),
    "space.d_model=128, space.n_heads=3 (fwd__ndr): d_model=128 is not divisible by n_heads=3": with_(
        space={"d_model": {"choice": [128]}, "n_heads": {"choice": [3]}}
    ),
    "metric: best_ood_valid_acc does not exist for task 'copy', which reports "
    "token_acc, seq_acc (e.g. ...)": with_(tasks=[{"task": "copy"}], models=["panm"], space={}),
    "name: \"it's\" must be 1-100 letters, digits, '_', '-' or '.' (not '..'), ...": with_(name="it's"),
}


def test_the_guides_refusals_are_the_lines_the_service_prints(tmp_path):
    """Each refusal the user guide shows for a file is what that input gets, '...' standing for the rest."""
    guide = (ROOT / "docs" / "guide" / "searching.md").read_text()
    table = guide[guide.index("| bad input | the one line") :].split("\n\n")[0].splitlines()[2:]
    shown = [row.split("|")[2].strip().split("`")[1] for row in table]
    assert set(REFUSALS_SHOWN) <= set(shown)
    for line, content in REFUSALS_SHOWN.items():
        path = write(tmp_path, content)
        with pytest.raises(SpecError) as err:
            load_study(path)
        pattern = ".*".join(re.escape(part) for part in line.split("..."))
        assert re.fullmatch(re.escape(f"{path}: ") + pattern, str(err.value)), (line, str(err.value))


@pytest.mark.parametrize(
    "file",
    ["ablations/scan_cpu.yaml", "ablations/sort_of_clevr_table7_d32.yaml", "ablations/ndr_table1.yaml"],
)
def test_a_calibration_config_is_one_every_pair_can_train(file):
    """SCAN and Sort-of-CLEVR have no train_size: the dry run said 'no time estimate' for them, and
    a GPU launch would have measured no stack size (each seed its own trial)."""
    from orchestrator.run.cost import CALIBRATION_TRAIN_SIZE, calibration_config
    from trainables.config import parse_trial_config

    study = load_study(Path(__file__).resolve().parent.parent / file)
    for pair in study.pairs:
        for stacked in (False, True):
            cfg = parse_trial_config(calibration_config(decide(study, True), pair, stacked))
            assert (
                cfg.task_options.get("train_size", cfg.task_options.get("train_images", 0))
                <= CALIBRATION_TRAIN_SIZE * cfg.batch_size
            )


def test_a_dry_run_calibrating_on_a_busy_machine_says_its_times_may_be_long(tmp_path, monkeypatch):
    from orchestrator.run import cost

    monkeypatch.undo()  # the real busy_note, not the fixture's
    monkeypatch.setattr(cost.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(cost.os, "getloadavg", lambda: (3.9, 3.0, 2.0))
    assert (
        cost.busy_note()
        == "  this machine is busy (load average 3.9 on 2 CPUs): the calibrated step times below "
        "may be many times too long"
    )
    monkeypatch.setattr(cost.os, "getloadavg", lambda: (0.5, 0.5, 0.5))
    assert cost.busy_note() is None
    study = load_study(write(tmp_path, GOOD))
    monkeypatch.setattr(cost, "resources", lambda address: ("this machine", {"CPU": 2}, [{"CPU": 2}]))
    monkeypatch.setattr(cost, "step_time", lambda *args: (None, "not timed here"))
    monkeypatch.setattr(cost, "busy_note", lambda: "  busy")
    assert next(cost.describe_cost(study, calibrate=True)) == "  busy" and "  busy" not in cost.describe_cost(
        study, calibrate=False
    )


def test_the_closing_lines_name_a_best_config_that_exists_and_count_diverged_trials(tmp_path, capsys):
    """Every trial of the first pair diverged: no best config of it was written, so the next step
    points at the other pair's (where none exists, at none), and the summary says why they failed."""
    from types import SimpleNamespace

    from orchestrator.record.state import plan_of
    from orchestrator.run.launch import print_summary

    study = load_study(write(tmp_path, GOOD))
    first, second = (pair.name for pair in study.pairs)
    state = SimpleNamespace(
        dir=tmp_path / "launch", tracking_uri="sqlite:///x.db", the_plan=lambda: plan_of(study)
    )
    summaries = {first: {"failed": 2, "diverged": 2}, second: {"done": 2, "best": 0.5, "test": 0.4}}
    print_summary(state, study, summaries)
    out = capsys.readouterr().out
    assert f"'failed' counts those that diverged ({first} 2)" in out and "orchestrator train" not in out
    (state.dir / "best").mkdir(parents=True)
    (state.dir / "best" / f"{second}.yaml").write_text("{}\n")
    print_summary(state, study, summaries)
    assert f"orchestrator train {state.dir / 'best' / second}.yaml;" in capsys.readouterr().out


def test_a_launch_recorded_before_a_refusal_is_read_as_it_ran(tmp_path):
    """Files refused now as meaningless (a grid without seeds, a search with nothing to search, a
    listed model that cannot run a listed task) once launched: their launch.json's text still loads,
    as it ran (one seed; identical trials; the model skipped), so status and report read them."""
    cases = [
        (with_(space={}, grid={"n_layers": [2, 4]}), "seeds: missing: an ablation trains each grid cell"),
        (with_(space={}), "seeds: missing, and no space to search"),
        (
            with_(tasks=[{"task": "copy"}], models=["panm", "ndr"], metric="best_ood_valid_token_acc"),
            "models[1]: ndr cannot run task 'copy'",
        ),
    ]
    for spec, refusal in cases:
        path = write(tmp_path, spec)
        with pytest.raises(SpecError, match=re.escape(refusal)):
            load_study(path)
        study = load_study(path, text=path.read_text(), recorded=True)
        assert study.pairs
    gridded, search, listed = (load_study(write(tmp_path, c), recorded=True) for c, _ in cases)
    assert gridded.seeds == (0,) and not search.is_ablation
    assert [p.model for p in listed.pairs] == ["panm"] and listed.skipped[0].startswith("copy x ndr: ")
