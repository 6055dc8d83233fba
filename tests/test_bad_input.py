"""Bad input never gets through: each case a fuzzer or a review found, refused in one line (the fuzzer
itself: test_fuzz.py)."""

import contextlib
import io
import json
import os
import shutil
import sqlite3
import time
from pathlib import Path

import pytest
import yaml

from orchestrator.cli import readers
from orchestrator.cli.process import main


def run_in(folder: Path, argv: list[str]) -> tuple[int, io.StringIO, io.StringIO]:
    """The CLI in this process, in `folder`: (exit status, its stdout, its stderr)."""
    out, err = io.StringIO(), io.StringIO()
    cwd = os.getcwd()
    os.chdir(folder)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            return main(argv), out, err
    except SystemExit as e:  # argparse's refusal
        return e.code, out, err
    finally:
        os.chdir(cwd)


GOOD = {
    "tasks": [{"task": "ctl", "variant": "fwd"}],
    "models": ["ndr", "lstm"],
    "budget": {"trials": 2, "max_concurrent": 1, "n_iters": 10, "eval_every": 5},
    "space": {"lr": {"loguniform": [1e-4, 1e-3]}},
    "tracking": {"uri": "sqlite:///store/mlflow.db"},
}
ABLATION = {
    **{k: v for k, v in GOOD.items() if k != "space"},
    "models": ["lstm"],
    "grid": {"lr": [1e-3]},
    "seeds": [1, 2],
}


def refused(folder: Path, argv: list[str]) -> str:
    """Run the CLI in `folder`; assert it refused with exit 2, one line, writing nothing. -> the line."""
    before = set(os.listdir(folder))
    code, out, err = run_in(folder, argv)
    lines = err.getvalue().strip().splitlines()
    assert code == 2 and len(lines) == 1, (code, out.getvalue()[-2000:], err.getvalue())
    assert set(os.listdir(folder)) == before, "a refused command wrote something"
    return lines[0]


# Rules, each caught where every value of its kind is checked (a case here stands for its rule).
SPEC_CASES = {
    "a fixed value the space replaces": (
        {**GOOD, "fixed": {"lr": "abc"}},
        "fixed (fwd__ndr): lr: expected a number",
    ),
    "a switch that is not true or false": (
        {**GOOD, "fixed": {"tf32": "yes please"}},
        "fixed (fwd__ndr): tf32: expected true or false",
    ),
    "a training value out of range": (
        {**GOOD, "fixed": {"batch_size": 0}},
        "fixed (fwd__ndr): batch_size: must be at least 1",
    ),
    "a negative custom resource": (
        {**GOOD, "resources": {"custom": {"slot": -2}}},
        "resources.custom.slot: must be a finite non-negative number",
    ),
    "an infinite resource": ({**GOOD, "resources": {"cpu": float("inf")}}, "resources.cpu: must be a finite"),
    "a range to infinity": (
        {**GOOD, "space": {"lr": {"loguniform": [1e-4, float("inf")]}}},
        "space.lr.loguniform: expected [low, high] finite numbers",
    ),
    "a model value no trial can use": (
        {**GOOD, "fixed": {"gate_drop": 5}},
        "fixed (fwd__ndr): gate_drop: must be at least 0 and less than 1",
    ),
    "a searched trial length": (
        {**GOOD, "space": {"n_iters": {"int": [10, 20]}}},
        "space.n_iters: a trial's length is not searched",
    ),
    "no seeds": ({**ABLATION, "seeds": []}, "seeds: expected a non-empty list of distinct integers"),
    "a seed twice": ({**ABLATION, "seeds": [1, 1]}, "seeds: expected a non-empty list of distinct integers"),
    "a seed a trial refuses": ({**ABLATION, "seeds": [-1]}, "seeds: seed: must be at least 0"),
    "a confirmation seed a trial refuses": (
        {**GOOD, "confirm": {"top_k": 1, "seeds": [2**40]}},
        "confirm.seeds: seed: must be at least 0",
    ),
    "a store that is a folder": ({**GOOD, "tracking": {"uri": "sqlite:///folder"}}, "tracking.uri: "),
    "a store that is not SQLite": ({**GOOD, "tracking": {"uri": "sqlite:///notes.txt"}}, "tracking.uri: "),
    # found by a review: tracebacks, and values that only a trial would have refused
    "task options that are not a mapping": (
        {**GOOD, "fixed": {"task_options": 5}},
        "fixed (fwd__ndr): task_options: expected a mapping",
    ),
    "a trial length in a grid": (
        {**ABLATION, "grid": {"n_iters": [5, 10]}},
        "grid.n_iters: a trial's length is not a grid key",
    ),
    "a grid value twice": ({**ABLATION, "grid": {"lr": [1e-3, 1e-3]}}, "grid.lr: repeated values"),
    "a grid value twice, as an integer and a float": (
        {**ABLATION, "grid": {"dropout": [0, 0.0]}},
        "grid.dropout: repeated values",
    ),
    "a choice twice, as an integer and a float": (
        {**GOOD, "space": {"n_layers": {"choice": [2, 2.0]}}},
        "space.n_layers.choice: repeated values",
    ),
    "a model twice": ({**GOOD, "models": ["ndr", "ndr"]}, "models[1]: ndr appears twice"),
    "a float range over a whole number": (
        {**GOOD, "space": {"batch_size": {"uniform": [1, 4]}}},
        "space.batch_size=1.5 (fwd__ndr): batch_size: expected an integer",
    ),
    "head counts inside a range that do not divide d_model": (
        {**GOOD, "models": ["transformer"], "fixed": {"d_model": 128}, "space": {"n_heads": {"int": [1, 8]}}},
        "space.n_heads=3 (fwd__transformer): d_model=128 is not divisible by n_heads=3",
    ),
    "a bad low end of a range is not blamed on fixed": (
        {**GOOD, "space": {"dropout": {"uniform": [-0.5, 0.5]}}},
        "space.dropout=-0.5 (fwd__ndr): dropout: must be",
    ),
    "a bad first grid cell is not blamed on fixed": (
        {**ABLATION, "grid": {"dropout": [1.5, 0.1]}},
        "grid.dropout=1.5 (fwd__lstm): dropout: must be",
    ),
    "a warm start that is not a switch": (
        {**GOOD, "warm_start": "no"},
        "warm_start: expected true or false, got 'no'",
    ),
    "a name that is not text": ({**GOOD, "name": None}, "name: expected a name, got None"),
    "a GPU in a grid no trial gets": (
        {**ABLATION, "grid": {"device": ["cpu", "cuda"]}},
        "grid.device: cuda needs a GPU, and resources.gpu gives its trials none",
    ),
    "a GPU in a space no trial gets": (
        {**GOOD, "space": {"device": {"choice": ["cuda", "cpu"]}}},
        "space.device: cuda needs a GPU",
    ),
    "an exponent YAML reads as text": (
        {**GOOD, "space": {"lr": {"loguniform": ["125e-6", 1.0e-3]}}},
        "space.lr.loguniform: expected [low, high] finite numbers, "
        "got ['125e-6', 0.001] (YAML reads 125e-6 as text: write 1.25e-04)",
    ),
    # a reason that names no key of the file (torch's "embed_dim must be divisible by num_heads") points
    # at the value probed
    "a later grid cell whose reason names no key": (
        {
            **ABLATION,
            "models": ["transformer_seq2seq"],
            "tasks": [{"task": "copy", "variant": "fwd"}],
            "metric": "best_ood_valid_token_acc",
            "grid": {"d_model": [64, 60]},
        },
        "grid.d_model=60 (fwd__transformer_seq2seq): ",
    ),
    # files that once ran with exit 0 though they could not have been meant
    "a listed model that cannot run a listed task": (
        {
            **GOOD,
            "tasks": [{"task": "copy"}],
            "models": ["panm", "lstm"],
            "metric": "best_ood_valid_token_acc",
        },
        "models[1]: lstm cannot run task 'copy': lstm runs sequence_classification and next_symbol_sets; "
        "copy is sequence_to_sequence, which panm, lstm_seq2seq, transformer_seq2seq run",
    ),
    "an ablation's grid without seeds": (
        {k: v for k, v in ABLATION.items() if k != "seeds"},
        "seeds: missing: an ablation trains each grid cell once per seed",
    ),
    "a model's grid without seeds": (
        {**GOOD, "space": {}, "per_model": {"lstm": {"grid": {"n_layers": [1, 2]}}}},
        "seeds: missing: an ablation trains each grid cell once per seed",
    ),
    "neither seeds nor a space": (
        {**GOOD, "space": {}},
        "seeds: missing, and no space to search: every trial of a pair would be the same",
    ),
    "a list for a key of one value": (
        {**GOOD, "seed": [0, 1]},
        "seed: expected one value, got a list [0, 1] (did you mean 'seeds'?)",
    ),
    "a misspelt key of a model's own": (
        {**GOOD, "per_model": {"ndr": {"spaces": {}}}},
        "per_model.ndr.spaces: unknown key (did you mean 'space'?)",
    ),
    "trial storage under a file": (
        {**GOOD, "storage": "notes.txt/trials"},
        "storage: cannot write trial storage in",
    ),
}


def test_every_value_a_file_gives_is_checked(tmp_path):
    for name, (data, reason) in SPEC_CASES.items():
        folder = tmp_path / name.replace(" ", "_")
        (folder / "folder").mkdir(parents=True)
        (folder / "notes.txt").write_text("not a database\n")
        path = folder / "space.yaml"
        path.write_text(yaml.safe_dump(data))
        line = refused(folder, ["launch", str(path), "--dry-run", "--no-calibrate"])
        assert line.startswith(f"orchestrator: error: {path}: {reason}"), (name, line)


TRAIN_CASES = {
    "batch_size=0": "batch_size: must be at least 1",
    "eval_every=0": "eval_every: must be at least 1",
    "seed=-1": "seed: must be at least 0",
    "device=tpu": "device: must be auto, cpu, cuda",
    "n_layers=-2": "n_layers: must be at least 1",
    "dropout=2": "dropout: must be at least 0 and less than 1",
    "threads=0": "threads: must be at least 1",
    "lr=abc": "lr: expected a number",
    "bf16=maybe": "bf16: must be one of auto, false, true",
    "lr=[1": "--set 'lr=[1': the value is not YAML",
    "lr.x=1": "--set 'lr.x=1': lr is",
    "model=[a]": "model: expected a name",
    "task_options=5": "task_options: expected a mapping",
    "lr=null": "lr: expected a number, got null",
    "lr=.nan": "lr: must be a finite number",
    "threads=100000000": "threads: must be at least 1 and at most 1024",
    "batch_size=true": "batch_size: expected a number, got true",
}


def test_train_set_gets_the_checks_of_a_launch(tmp_path):
    """`orchestrator train --set` refuses what a launch's file would: one line, exit 2, before training."""
    for assignment, reason in TRAIN_CASES.items():
        line = refused(tmp_path, ["train", "ctl/lstm", "--set", "n_iters=2", "--set", assignment])
        assert line.startswith(f"orchestrator: error: ctl/lstm: {reason}"), (assignment, line)


# Model values the constructors took and the first step (or never) failed on.
MODEL_CASES = {
    ("ctl/ndr", "n_layers=0"): "n_layers: must be at least 1",
    ("ctl/ndr", "ff_multiplier=0"): "ff_multiplier: must be greater than 0",
    ("ctl/ndr", "gate_bias_init=.nan"): "gate_bias_init: must be a finite number",
    ("ctl/ndr", "act_threshold=1.5"): "act_threshold: must be",
    ("copy/panm", "address_bits=200"): "address_bits: must be at least 1 and at most 62",
    ("copy/panm", "mode2_heads=-1"): "mode2_heads: must be at least 0",
    ("ctl/ndr", "n_layers=null"): "n_layers: expected a number, got null",
    ("ctl/ndr", "d_model=true"): "d_model: expected a number, got true",
    # checked by building it: an LSTM of 10^6 layers took minutes and most of the memory, a PANM of
    # 10^6 Mode-2 heads more than 20 s (mutations drew both)
    ("ctl/lstm", "n_layers=1000000"): "n_layers: must be at least 1 and at most 1000",
    ("copy/panm", "mode2_heads=1000000"): "mode2_heads: must be at least 0 and at most 1000",
    (
        "scan/transformer_enc_dec",
        "decoder_layers=5000",
    ): "decoder_layers: must be at least 1 and at most 1000",
}


def test_model_values_no_trial_can_use_are_refused(tmp_path):
    for (source, assignment), reason in MODEL_CASES.items():
        line = refused(tmp_path, ["train", source, "--set", "n_iters=2", "--set", assignment])
        assert line.startswith(f"orchestrator: error: {source}: {reason}"), (assignment, line)


def test_yaml_that_pyyaml_lets_through_as_other_errors_is_one_line(tmp_path):
    """A list as a key, nesting past the recursion limit, an integer past Python's digit limit: PyYAML
    raised TypeError, RecursionError and ValueError for these, tracebacks instead of the line."""
    for name, text in {
        "list_key": "name: x\n? [a, b]\n: 1\n",
        "deep": "a: " + "[" * 3000 + "\n",
        "long_int": "seed: " + "9" * 5000 + "\n",
    }.items():
        path = tmp_path / f"{name}.yaml"
        path.write_text(text)
        for argv in (["launch", str(path), "--dry-run", "--no-calibrate"], ["train", str(path)]):
            line = refused(tmp_path, argv)
            assert line.startswith(f"orchestrator: error: {path}") and "malformed YAML" in line, (
                name,
                argv,
                line,
            )


def test_a_trial_files_yaml_error_names_its_line_as_a_launch_files_does(tmp_path):
    """`train` gave the parser's context alone ("malformed YAML: while parsing a flow sequence")."""
    path = tmp_path / "trial.yaml"
    path.write_text("task: ctl\nmodel: [lstm\n")
    for argv in (["launch", str(path), "--dry-run", "--no-calibrate"], ["train", str(path)]):
        assert (
            refused(tmp_path, argv)
            == f"orchestrator: error: {path}: line 3: malformed YAML: expected ',' or "
            "']', but got '<stream end>'"
        )


def test_bad_arguments_are_one_line_too(tmp_path):
    """argparse printed its usage before the error: several lines."""
    for argv in (
        ["list", "zz"],
        ["launch"],
        ["frob"],
        ["train", "ctl/ndr", "--set"],
        ["status", "--bogus"],
        ["dashboard", "--port", "99999"],
    ):
        err = io.StringIO()
        with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as exit_:
            main(argv)
        lines = err.getvalue().strip().splitlines()
        assert (
            exit_.value.code == 2
            and len(lines) == 1
            and lines[0].startswith("orchestrator")
            and "error: " in lines[0]
        ), (argv, lines)


def test_version_is_the_packages_as_pyproject_gives_it(capsys):
    """`orchestrator --version`: the installed metadata's version, which is pyproject.toml's (an install
    older than the file would print another) and the newest heading of docs/changelog.md."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11 on

    root = Path(__file__).resolve().parent.parent
    version = tomllib.loads((root / "pyproject.toml").read_text())["project"]["version"]
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out == f"orchestrator {version}\n"
    changelog = (root / "docs" / "changelog.md").read_text()
    assert changelog.split("\n## ", 1)[1].startswith(version), "docs/changelog.md's newest heading"


def test_a_damaged_launch_record_is_one_line_and_does_not_hide_the_others(tmp_path):
    """Its plan too: `status` and `best` read it without parsing the spec, and gave tracebacks."""
    storage = tmp_path / "runs"
    record = {
        "launch_id": "x",
        "experiment": "e",
        "spec_file": "s.yaml",
        "spec_text": "",
        "tracking_uri": "sqlite:///m.db",
        "parent_run_id": "r",
    }
    plan = {"metric": "m", "mode": "max", "score": "acc", "ablation": False}
    pair = {"name": "p", "trials": 3, "chance": 0.25, "grid": {}}
    plans = {
        "plan_a_list": [],
        "plan_keys_missing": {"metric": "m"},
        "plan_without_mode": {k: v for k, v in plan.items() if k != "mode"} | {"pairs": []},
        "plan_pairs_wrong": {**plan, "pairs": [{"trials": 3}]},
        "plan_pair_without_chance": {**plan, "pairs": [{k: v for k, v in pair.items() if k != "chance"}]},
        "plan_pair_grid_wrong": {**plan, "pairs": [{**pair, "grid": [1]}]},
        "plan_score_a_list": {**plan, "pairs": [], "score": []},
    }
    # A field of another type: `"launch_id": 5` was read as a launch the store holds no runs of, and
    # `report` wrote an empty report over the launch's; each of the others was a traceback.
    retyped = {
        "launch_id_a_number": {"launch_id": 5},
        "experiment_a_number": {"experiment": 7},
        "tracking_uri_a_number": {"tracking_uri": 3},
        "state_a_number": {"state": 7},
        "stack_sizes_a_list": {"stack_sizes": [1]},
        "regressed_a_list": {"regressed": []},
        "created_text": {"created": "yesterday"},
    }
    damaged = {
        "not_json": "{",
        "a_list": "[]",
        "fields_missing": "{}",
        "nested_past_the_parser": "[" * 200_000 + "]" * 200_000,
        **{k: json.dumps({**record, "plan": v}) for k, v in plans.items()},
        **{k: json.dumps({**record, **v}) for k, v in retyped.items()},
    }
    for launch_id, text in damaged.items():
        (storage / launch_id).mkdir(parents=True)
        (storage / launch_id / "launch.json").write_text(text)
        line = refused(tmp_path, ["status", "--storage-path", str(storage), launch_id])
        assert line.startswith(
            f"orchestrator: error: {storage / launch_id}/launch.json: not a launch record"
        ), line
        if launch_id.startswith("plan"):
            assert "plan" in line.split("not a launch record", 1)[1], line
            assert refused(tmp_path, ["best", "--storage-path", str(storage), launch_id]) == line
    code, out, _ = run_in(tmp_path, ["list", "launches", "--storage-path", str(storage)])
    assert code == 0 and out.getvalue().count(" damaged ") == len(damaged), out.getvalue()


def test_a_range_over_a_key_whose_paper_setting_is_null_plans(tmp_path):
    """The warm start moves the paper's setting into the range: a null one (threads) crashed it."""
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump({**GOOD, "space": {"threads": {"int": [1, 2]}}}))
    code, out, err = run_in(tmp_path, ["launch", str(path), "--dry-run", "--no-calibrate"])
    assert code == 0 and err.getvalue() == "", err.getvalue()


def test_a_pair_without_a_paper_setting_plans_at_the_trials_default_length(tmp_path):
    """No preset and no budget.n_iters (CTL with compositional attention): the dry run crashed on
    the missing length; the pair trains the trial's default, which the plan and the cost now use."""
    path = tmp_path / "space.yaml"
    budget = {k: v for k, v in GOOD["budget"].items() if k != "n_iters"}
    path.write_text(yaml.safe_dump({**GOOD, "models": ["transformer_compositional"], "budget": budget}))
    code, out, err = run_in(tmp_path, ["launch", str(path), "--dry-run", "--no-calibrate"])
    assert code == 0 and err.getvalue() == "", err.getvalue()
    assert "30,000" in out.getvalue() or "30000" in out.getvalue(), out.getvalue()


@pytest.mark.skipif(
    __import__("torch").cuda.is_available(), reason="this machine has the GPU the case asks for"
)
def test_training_on_a_gpu_this_machine_lacks_is_one_line(tmp_path):
    """A GPU launch's best config re-run here (`orchestrator train runs/<launch>/best/<pair>.yaml`)
    crashed in torch."""
    line = refused(tmp_path, ["train", "ctl/lstm", "--set", "n_iters=2", "--set", "device=cuda"])
    assert line.startswith(
        "orchestrator: error: ctl/lstm: device: cuda, but torch finds 0 CUDA device(s) here"
    ), line


def test_a_launch_id_in_use_is_refused_not_overwritten(tmp_path):
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(GOOD))
    (tmp_path / "runs" / "taken").mkdir(parents=True)
    (tmp_path / "runs" / "taken" / "launch.json").write_text("{}")
    line = refused(tmp_path, ["launch", str(path), "--dry-run", "--no-calibrate", "--launch-id", "taken"])
    assert line.startswith(
        "orchestrator: error: --launch-id: launch taken exists in runs; `orchestrator resume taken`"
    ), line


def test_accept_writes_launch_json_without_the_stores_password(tmp_path, monkeypatch):
    """`accept` only marks launch.json; it asked for the password of a store it never opens."""
    from orchestrator.record.state import LaunchState

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    night = LaunchState(
        "night-2",
        tmp_path / "runs" / "night-2",
        "nightly",
        "n.yaml",
        "",
        "postgresql+psycopg://u:***@127.0.0.1/x",
        "r",
        state="finished",
        night=1,
        regressed=True,
    )
    night.dir.mkdir(parents=True)
    night.save()
    code, out, err = run_in(tmp_path, ["accept", "--storage-path", "runs", "night-2"])
    assert code == 0 and "accepted night night-2's regression" in out.getvalue(), err.getvalue()
    assert LaunchState.load(night.dir).accepted


def test_a_year_as_a_name_and_an_empty_warm_start_still_plan(tmp_path):
    """What files said before the types were checked: a whole-number name, warm_start null (false)."""
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump({**GOOD, "name": 2024, "warm_start": None}))
    code, out, err = run_in(tmp_path, ["launch", str(path), "--dry-run", "--no-calibrate"])
    assert code == 0 and err.getvalue() == "", err.getvalue()


def test_trial_storage_under_home_is_checked_where_the_launch_puts_it(tmp_path, monkeypatch):
    """`storage: ~/trials` was checked as ./~/trials: a home that cannot hold it passed the dry run."""
    (tmp_path / "home_is_a_file").write_text("")
    monkeypatch.setenv("HOME", str(tmp_path / "home_is_a_file"))
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump({**GOOD, "storage": "~/trials"}))
    line = refused(tmp_path, ["launch", str(path), "--dry-run", "--no-calibrate"])
    assert line.startswith(
        f"orchestrator: error: {path}: storage: cannot write trial storage in ~/trials "
        f"({tmp_path / 'home_is_a_file'} is not"
    ), line


def test_a_store_unreachable_before_a_launch_is_registered_still_exits_4(tmp_path, monkeypatch, capsys):
    """The damaged-store handler (any Exception, re-raised unless SQLite calls the file damaged) once
    stood before this one and re-raised StoreUnavailable past it, as a traceback with status 1."""
    from orchestrator.record.retries import StoreUnavailable
    from orchestrator.run.exits import EXIT_STORE_UNREACHABLE

    def unreachable(args):
        raise StoreUnavailable("tracking store sqlite:///x.db unreachable for 31 s")

    monkeypatch.setattr(readers, "cmd_status", unreachable)
    assert main(["status"]) == EXIT_STORE_UNREACHABLE
    assert capsys.readouterr().err.splitlines() == [
        "orchestrator: error: tracking store sqlite:///x.db unreachable for 31 s; nothing was started: run "
        "the command again once the store answers"
    ]


# Found by the fuzzer (test_fuzz.py): each a traceback, a hang, a wrong reason or a wrong exit before.
def test_a_file_named_that_no_read_can_take_is_one_line(tmp_path):
    """A name too long (a traceback from the existence check), a symlink loop ("no such file"), a
    NUL in the name, a device (/dev/zero never ends): each refused before it is read."""
    (tmp_path / "loop.yaml").symlink_to("loop.yaml")
    cases = {
        str(tmp_path / ("x" * 300 + ".yaml")): "file: File name too long",
        str(tmp_path / "loop.yaml"): "file: Too many levels of symbolic links",
        str(tmp_path / "a\x00b.yaml"): "file: embedded null byte",
        "/dev/zero": "file: not a regular file",
        "/dev/null": "file: not a regular file",
    }
    for path, reason in cases.items():
        for argv in (["launch", path, "--dry-run", "--no-calibrate"], ["train", path]):
            line = refused(tmp_path, argv)
            shown = path.replace("\x00", "\\x00")  # the one line escapes a control character
            assert line.startswith(f"orchestrator: error: {shown}: {reason}"), (argv, line)


def test_a_file_past_a_megabyte_is_refused_before_it_is_parsed(tmp_path):
    """200,000 keys took PyYAML 22 s to parse, before the first unknown key was named."""
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(GOOD) + "".join(f"k{i}: {i}\n" for i in range(200_000)))
    line = refused(tmp_path, ["launch", str(path), "--dry-run", "--no-calibrate"])
    assert line.startswith(f"orchestrator: error: {path}: file: 2,") and "at most 1,048,576" in line, line


def test_an_alias_bomb_is_refused_before_anything_walks_it(tmp_path):
    """Billion laughs: nine levels of ten aliases, 10^9 values, once a message printed one of them."""
    levels = "".join(f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]\n" for i in range(1, 10))
    path = tmp_path / "space.yaml"
    path.write_text("l0: &l0 [lol]\n" + levels + yaml.safe_dump(GOOD))
    line = refused(tmp_path, ["launch", str(path), "--dry-run", "--no-calibrate"])
    assert line == (
        f"orchestrator: error: {path}: file: malformed YAML: its aliases expand to more than 1,000,000 values"
    ), line


def test_a_merge_key_gives_the_keys_a_mapping_lacks(tmp_path):
    """`<<: *defaults` was refused as a tag with no constructor ("malformed YAML")."""
    path = tmp_path / "space.yaml"
    text = yaml.safe_dump({k: v for k, v in GOOD.items() if k != "space"})
    path.write_text(
        "space: {lr: &range {loguniform: [1.0e-4, 1.0e-3]}}\n"
        "per_model: {lstm: {space: {lr: {<<: *range}}}}\n" + text
    )
    code, out, err = run_in(tmp_path, ["launch", str(path), "--dry-run", "--no-calibrate"])
    assert code == 0 and err.getvalue() == "", err.getvalue()
    path.write_text(
        "space: {lr: {<<: {int: [1, 2]}, loguniform: [1.0e-4, 1.0e-3], loguniform: [1, 2]}}\n" + text
    )
    line = refused(tmp_path, ["launch", str(path), "--dry-run", "--no-calibrate"])
    assert "malformed YAML: duplicate key 'loguniform'" in line, line


def test_a_nul_in_a_file_is_one_line_naming_its_line(tmp_path):
    """PyYAML's reader error spans two lines ('in "<unicode string>", position 350')."""
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(GOOD).replace("models:", "models:\x00", 1))
    line = refused(tmp_path, ["launch", str(path), "--dry-run", "--no-calibrate"])
    assert line.startswith(f"orchestrator: error: {path}: line ") and "character #x0000" in line, line


def test_folders_no_file_system_can_name_are_one_line(tmp_path):
    """A NUL or a name past NAME_MAX in storage or storage_path raised ValueError or OSError."""
    for key, value in [("storage", "a\x00b"), ("storage_path", "a\x00b"), ("storage_path", "x" * 5000)]:
        path = tmp_path / "space.yaml"
        path.write_text(yaml.safe_dump({**GOOD, key: value}))
        line = refused(tmp_path, ["launch", str(path), "--dry-run", "--no-calibrate"])
        assert line.startswith(f"orchestrator: error: {path}: {key}: cannot ") and "not a usable path" in (
            line
        ), line


def test_a_tracking_uri_no_connection_can_take_is_refused_at_once(tmp_path, monkeypatch):
    """A port past 65535 was retried for 32 s as an outage and ended in exit 4; an open bracket, a NUL
    or a name too long were tracebacks."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    cases = {
        "http://127.0.0.1:99999": "malformed: Port out of range 0-65535",
        "postgresql://u@127.0.0.1:99999/db": "malformed: Port out of range 0-65535",
        "http://127.0.0.1:0": "malformed: port 0 takes no connection",
        "http://[::1": "malformed: Invalid IPv6 URL",
        "http://": "malformed: no host",
        "sqlite:///a\x00b.db": "it holds a control character",
        "sqlite:///" + "x" * 300 + "/m.db": "not a usable path (File name too long)",
    }
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(GOOD))
    run_in(tmp_path, ["launch", str(path), "--dry-run", "--no-calibrate"])  # the imports, before the clock
    for uri, reason in cases.items():
        path.write_text(yaml.safe_dump({**GOOD, "tracking": {"uri": uri}}))
        for argv, where in (
            (["launch", str(path), "--dry-run", "--no-calibrate"], f"{path}: tracking.uri"),
            (["launch", str(path), "--dry-run", "--no-calibrate", "--tracking-uri", uri], "--tracking-uri"),
        ):
            start = time.monotonic()
            line = refused(tmp_path, argv)
            assert time.monotonic() - start < 5 and line.startswith(f"orchestrator: error: {where}: "), line
            assert line.endswith(reason) or reason in line, (uri, line)


def test_another_programs_sqlite_database_is_no_tracking_store(tmp_path):
    """A launch checked only the file's first 16 bytes: MLflow would have written its tables among an
    application's; a header over zeros passed the dry run and failed the launch."""
    path = tmp_path / "space.yaml"
    with contextlib.closing(sqlite3.connect(tmp_path / "app.db")) as db:
        db.execute("CREATE TABLE accounts (id INTEGER)")
        db.commit()
    (tmp_path / "zeros.db").write_bytes(b"SQLite format 3\x00" + bytes(4096))
    os.mkfifo(tmp_path / "fifo.db")
    for name, reason in {
        "app.db": "is another program's SQLite database (tables: accounts), not an MLflow store",
        "zeros.db": "the tracking store's database is damaged: file is not a database",
        "fifo.db": "is not a regular file (a FIFO, a socket or a device)",
    }.items():
        path.write_text(yaml.safe_dump({**GOOD, "tracking": {"uri": f"sqlite:///{name}"}}))
        line = refused(tmp_path, ["launch", str(path), "--dry-run", "--no-calibrate"])
        separator = ": " if name == "zeros.db" else " "
        assert line == f"orchestrator: error: {path}: tracking.uri: {tmp_path / name}{separator}{reason}", (
            line
        )


def test_a_tag_its_value_does_not_fit_is_one_line(tmp_path):
    """PyYAML's constructors raised KeyError (`!!bool`), AttributeError (`!!timestamp`) or TypeError
    (`!!map` over a list): tracebacks."""
    path = tmp_path / "space.yaml"
    for value, reason in {
        "!!bool name": "line 1: malformed YAML: 'name' cannot be read as tag:yaml.org,2002:bool",
        "!!timestamp x": "line 1: malformed YAML: 'x' cannot be read as tag:yaml.org,2002:timestamp",
        "!!map [1]": "file: malformed YAML: cannot unpack non-iterable ScalarNode object",
    }.items():
        path.write_text(f"name: {value}\n" + yaml.safe_dump(GOOD))
        line = refused(tmp_path, ["launch", str(path), "--dry-run", "--no-calibrate"])
        assert line == f"orchestrator: error: {path}: {reason}", line


def test_a_reason_that_quotes_a_large_value_keeps_its_start_and_end(tmp_path):
    """A list of 5,000 seeds (or an alias bomb's thousands of values) was quoted whole: a line of 30 KB."""
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump({**GOOD, "seed": list(range(5000))}))
    line = refused(tmp_path, ["launch", str(path), "--dry-run", "--no-calibrate"])
    assert line.startswith(f"orchestrator: error: {path}: seed: expected one value, got a list [0, 1, 2"), (
        line
    )
    assert " ... " in line and line.endswith("(did you mean 'seeds'?)") and len(line) < 800, line


def test_a_line_break_in_a_name_given_stays_on_the_one_line(tmp_path):
    """`orchestrator accept $'\\r'`: the launch name was echoed as it was given, over three lines."""
    for name in ("\r", "a\nb"):
        for command in ("status", "accept", "report"):
            line = refused(tmp_path, [command, name])
            assert line.startswith(f"orchestrator: error: no launch {name!r}"), line


def test_a_model_file_that_exits_on_import_is_one_line(tmp_path):
    (tmp_path / "m.py").write_text("import sys\nsys.exit(3)\n")
    line = refused(tmp_path, ["train", "ctl/m.py:Net", "--set", "n_iters=1"])
    assert "does not load: SystemExit" in line, line


def test_a_set_value_nested_past_the_recursion_limit_is_one_line(tmp_path):
    line = refused(tmp_path, ["train", "ctl/lstm", "--set", "lr=" + "[" * 3000])
    assert "the value is not YAML" in line, line


def test_a_store_of_another_mlflow_schema_or_missing_tables_is_one_line(tmp_path):
    """Readers on a store that a newer MLflow wrote (alembic's "Can't locate revision") or an older one
    (MLflow's "out-of-date database schema") gave tracebacks; on one missing tables MLflow created
    them, writing into a store a reader only reads."""
    from test_status import SEARCH, launch

    state = launch(tmp_path, SEARCH, {((), 0): ("completed", 0.5, 0.4)})
    store = tmp_path / "copy.db"  # a store this process has not opened (MLflow keeps the ones it has)
    shutil.copyfile(state.tracking_uri.removeprefix("sqlite:///"), store)
    state.tracking_uri = f"sqlite:///{store}"
    state.save()
    for version, reason in {
        "ffffffffffff": "its MLflow schema ffffffffffff is unknown to MLflow",
        "451aebb31d03": "its MLflow schema 451aebb31d03 is older than MLflow",  # MLflow's first
    }.items():
        with contextlib.closing(sqlite3.connect(store)) as db:
            db.execute("UPDATE alembic_version SET version_num = ?", (version,))
            db.commit()
        line = refused(tmp_path, ["status", "--storage-path", "runs", state.launch_id])
        assert line.startswith(f"orchestrator: error: {state.tracking_uri}: {reason}"), line
    with contextlib.closing(sqlite3.connect(store)) as db:
        db.execute("DROP TABLE latest_metrics")
    before = store.stat().st_mtime_ns
    line = refused(tmp_path, ["status", "--storage-path", "runs", state.launch_id])
    assert "holds no MLflow store" in line and store.stat().st_mtime_ns == before, line


def test_the_boards_store_and_folder_are_checked_before_it_is_built(tmp_path, monkeypatch):
    """`board --tracking-uri` went unchecked to MLflow's client: a port past 65535 or an open bracket
    was a traceback, `http://` a hang of retries; an --output name too long a traceback at mkdir."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    (tmp_path / "runs").mkdir()
    for argv, reason in {
        (
            "--tracking-uri",
            "http://127.0.0.1:99999",
        ): "--tracking-uri: http://127.0.0.1:99999: malformed: Port",
        ("--tracking-uri", "http://[::1"): "--tracking-uri: http://[::1: malformed: Invalid IPv6 URL",
        ("--tracking-uri", "http://"): "--tracking-uri: http://: malformed: no host",
        ("--output", "x" * 300): "--output: cannot write the board in xxx",
        ("--storage-path", "x" * 300): "--storage-path: no such folder xxx",
    }.items():
        line = refused(
            tmp_path, ["board", *(["--storage-path", "runs"] if "--storage-path" not in argv else []), *argv]
        )
        assert line.startswith(f"orchestrator: error: {reason}"), line


def test_a_launch_name_no_file_system_takes_is_one_line(tmp_path):
    """`orchestrator accept <5,000 characters>` was a traceback (ENAMETOOLONG) from the launch's lookup."""
    for command in ("status", "accept", "best", "export", "report"):
        line = refused(tmp_path, [command, "a" * 5000])
        assert line.startswith("orchestrator: error: no launch 'aaa") and line.endswith(
            ": File name too long"
        ), line


def test_an_integer_past_64_bits_is_refused_where_the_file_gives_it(tmp_path):
    """budget.n_iters or resources.cpu of 400 digits: OverflowError (int too large to convert to float)
    in the budget's check, the pairs' resources, the cost."""
    path = tmp_path / "space.yaml"
    for key in ("n_iters", "trials", "max_concurrent"):
        text = yaml.safe_dump({**GOOD, "budget": {**GOOD["budget"], key: 7}})
        path.write_text(text.replace(f"{key}: 7", f"{key}: {'1' * 400}"))
        line = refused(tmp_path, ["launch", str(path), "--dry-run", "--no-calibrate"])
        assert (
            line.startswith(f"orchestrator: error: {path}: line ") and "is past a 64-bit integer" in line
        ), line


def test_the_boards_page_is_checked_before_anything_is_written(tmp_path):
    """`board --output 0 --docs 0` wrote the folder, then failed on the page; a NUL or a name too long
    in --docs was a traceback."""
    (tmp_path / "runs").mkdir()
    for docs, reason in {
        "0": "the folder --output names",
        "a\x00b": "not a usable path",
        "x" * 300: "not a usable",
    }.items():
        line = refused(tmp_path, ["board", "--storage-path", "runs", "--output", "0", "--docs", docs])
        assert line.startswith("orchestrator: error: --docs: ") and reason in line, line


def test_a_batch_size_past_any_machine_is_one_line(tmp_path):
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump({**GOOD, "fixed": {"batch_size": 1e308}}))
    refused(tmp_path, ["launch", str(path), "--dry-run", "--no-calibrate"])
