"""A fuzzer of every input the service reads: Hypothesis mutations of the shipped search-space,
ablation and nightly files, of `--set` values and of each command's arguments, by family (YAML's own
features, bytes and encodings, numbers, names, paths, stores, URIs, model files). The property of
every case: exit status 0, 2 or 4; on 2 or 4 one line on stderr and nothing written in the case's
folder; never a traceback; an answer within CASE_LIMIT_S.

CI runs a short, derandomized pass; BAD_INPUT_EXAMPLES=N runs N random cases a test (the long
run, docs/guide/searching.md#what-a-launch-refuses)."""

import contextlib
import json
import math
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from test_bad_input import run_in

from orchestrator.cli.parser import COMMANDS

ROOT = Path(__file__).resolve().parent.parent
SEARCHES = sorted((ROOT / "search_spaces").glob("*.yaml"))
ABLATIONS = sorted((ROOT / "ablations").glob("*.yaml"))
NIGHTLIES = [ROOT / "deploy" / "nightly.yaml", ROOT / "deploy" / "nightly-cpu.yaml"]
SHIPPED = [*SEARCHES, *ABLATIONS]
CASE_LIMIT_S = 30
LONG_RUN = os.environ.get("BAD_INPUT_EXAMPLES")


def fuzz(examples: int):
    """Hypothesis' settings of a fuzz test: `examples` derandomized cases in CI, or BAD_INPUT_EXAMPLES
    random ones (the long run)."""
    return settings(
        max_examples=int(LONG_RUN) if LONG_RUN else examples,
        derandomize=not LONG_RUN,
        database=None,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )


# ---------------------------------------------------------------------------------------------------
# The property


class TooSlow(Exception):
    pass


@contextlib.contextmanager
def within(seconds: int, what):
    """SIGALRM after `seconds`: a read that blocks (a FIFO) or a loop that does not end fails the case
    instead of hanging the run."""

    def expired(signum, frame):
        raise TooSlow(f"no answer within {seconds} s: {what!r}")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def snapshot(folder: Path) -> dict:
    """Every path under `folder` with its size and modification time (what a write changes)."""
    seen = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            with contextlib.suppress(OSError):
                st_ = path.lstat()
                seen[str(path.relative_to(folder))] = (st_.st_size, st_.st_mtime_ns)
    return seen


def answers(folder: Path, argv: list[str], codes=(0, 2, 4)) -> tuple[int, str, str]:
    """Run `argv` in `folder` and check the property; -> (exit status, stdout, stderr)."""
    before = snapshot(folder)
    start = time.monotonic()
    with within(CASE_LIMIT_S, argv):
        code, out, err = run_in(folder, argv)
    out, err = out.getvalue(), err.getvalue()
    took = time.monotonic() - start
    assert took < CASE_LIMIT_S, (argv, took)
    assert "Traceback" not in err, err[-3000:]
    assert code in codes, (argv, code, out[-1000:], err[-2000:])
    if code != 0:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("orchestrator") and "error: " in lines[0], (argv, err)
        assert snapshot(folder) == before, f"a refused command wrote something: {argv}"
    return code, out, err


# ---------------------------------------------------------------------------------------------------
# Values by family

NUMBERS = st.one_of(
    st.sampled_from([math.nan, math.inf, -math.inf, 0, -1, -0.0, 1e308, 5e-324, 2**31, 2**63, 2**64 + 1]),
    st.sampled_from([10**30, -(10**30), 10**400, True, False, None, "1e3", "0x10", "1_000", "1:30", ".inf"]),
    st.integers(),
    st.floats(),
)
NAMES = st.one_of(
    st.sampled_from(
        [
            "",
            "a" * 100,
            "a" * 101,
            "a" * 5000,
            "a/b",
            "../x",
            "/etc",
            "a\x00b",
            "x y",
            "it's",
            'a"b',
            "a,b",
            "a=b",
            "é",
            "名前",
            "a\u202eb",
            "a\nb",
            "-a",
            ".",
            "..",
            "~",
            "$home",
            "a%2Fb",
            "a:b",
        ]
    ),
    st.text(max_size=40),
)
TEXTS = st.one_of(NAMES, st.sampled_from(["ndr", "copy", "lstm", "sqlite:///x.db", "all", "1e-3"]))
VALUES = st.one_of(
    NUMBERS,
    TEXTS,
    st.lists(st.integers(-3, 100), max_size=3),
    st.dictionaries(
        st.sampled_from(["low", "x", "uniform", "choice", "int"]), st.integers(-1, 3), max_size=2
    ),
)


def paths_of(node, prefix=()):
    """Every path to a key or item in parsed YAML."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield (*prefix, k)
            yield from paths_of(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield (*prefix, i)
            yield from paths_of(v, (*prefix, i))


def mutate(draw, data, values, times: int):
    """`data` with `times` keys or items changed: a value from `values`, deleted, renamed, reversed."""
    for _ in range(times):
        paths = list(paths_of(data))
        if not paths:
            return data
        where = draw(st.sampled_from(paths))
        parent = data
        for step in where[:-1]:
            parent = parent[step]
        last = where[-1]
        action = draw(st.sampled_from(["value", "value", "delete", "rename", "reverse"]))
        if action == "delete":
            del parent[last]
        elif action == "rename" and isinstance(parent, dict):
            parent[draw(st.one_of(st.sampled_from(["nme", "modles", "n_layer", "lr ", "grid"]), NAMES))] = (
                parent.pop(last)
            )
        elif action == "reverse" and isinstance(parent[last], list):
            parent[last] = parent[last][::-1]
        else:
            parent[last] = draw(values)
    return data


def launch_argv(path: Path) -> list[str]:
    return ["launch", str(path), "--dry-run", "--no-calibrate"]


def case_folder(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("case")


# ---------------------------------------------------------------------------------------------------
# Shipped files mutated: values of each family in place of theirs


@st.composite
def mutated_files(draw, values=VALUES):
    source = draw(st.sampled_from(SHIPPED))
    data = mutate(draw, yaml.safe_load(source.read_text()), values, draw(st.integers(1, 2)))
    return source.name, yaml.safe_dump(data)


@fuzz(30)
@given(mutated_files())
def test_a_mutated_file_is_launchable_or_refused_in_one_line_with_nothing_written(tmp_path_factory, case):
    name, text = case
    folder = case_folder(tmp_path_factory)
    path = folder / name
    path.write_text(text)
    code, _, err = answers(folder, launch_argv(path), codes=(0, 2))
    assert code == 0 or err.startswith(f"orchestrator: error: {path}"), err


@fuzz(15)
@given(mutated_files(NUMBERS))
def test_numbers_in_a_shipped_file(tmp_path_factory, case):
    """NaN, infinities, huge, negative, booleans and text where a file has a value."""
    name, text = case
    folder = case_folder(tmp_path_factory)
    (folder / name).write_text(text)
    answers(folder, launch_argv(folder / name), codes=(0, 2))


@fuzz(15)
@given(mutated_files(NAMES))
def test_names_in_a_shipped_file(tmp_path_factory, case):
    """Long names, '/', NUL, what MLflow or a file system refuses, unicode, as a value or a key."""
    name, text = case
    folder = case_folder(tmp_path_factory)
    (folder / name).write_text(text)
    answers(folder, launch_argv(folder / name), codes=(0, 2))


@st.composite
def mutated_nightlies(draw):
    source = draw(st.sampled_from(NIGHTLIES))
    data = yaml.safe_load(source.read_text())
    data["ablations"] = data["ablations"][:2]  # a night of two is a night of several, in half the time
    return source.name, yaml.safe_dump(mutate(draw, data, VALUES, 1))


@fuzz(6)
@given(mutated_nightlies())
def test_a_mutated_nightly_file(tmp_path_factory, case):
    name, text = case
    folder = case_folder(tmp_path_factory)
    (folder / "deploy").mkdir()
    (folder / "ablations").symlink_to(ROOT / "ablations")
    (folder / "deploy" / name).write_text(text)
    answers(folder, ["nightly", f"deploy/{name}", "--dry-run", "--no-calibrate"])


# ---------------------------------------------------------------------------------------------------
# YAML's own features, on the node graph of a shipped file

TAGS = [
    "tag:yaml.org,2002:python/object/apply:os.system",
    "tag:yaml.org,2002:python/name:os.system",
    "tag:yaml.org,2002:binary",
    "tag:yaml.org,2002:timestamp",
    "tag:yaml.org,2002:int",
    "tag:yaml.org,2002:float",
    "tag:yaml.org,2002:bool",
    "tag:yaml.org,2002:null",
    "tag:yaml.org,2002:str",
    "tag:yaml.org,2002:set",
    "tag:yaml.org,2002:omap",
    "!custom",
]


def nodes_of(node, seen=None):
    seen = set() if seen is None else seen
    if id(node) in seen:
        return
    seen.add(id(node))
    yield node
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            yield from nodes_of(k, seen)
            yield from nodes_of(v, seen)
    elif isinstance(node, yaml.SequenceNode):
        for v in node.value:
            yield from nodes_of(v, seen)


def scalar(value: str, tag="tag:yaml.org,2002:str") -> yaml.ScalarNode:
    return yaml.ScalarNode(tag, value)


def alias_bomb(depth: int, width: int) -> yaml.Node:
    """Billion laughs: `width` aliases of the level below, `depth` levels (width ** depth values)."""
    node = scalar("lol")
    for _ in range(depth):
        node = yaml.SequenceNode("tag:yaml.org,2002:seq", [node] * width)
    return node


def nested(depth: int, mapping: bool) -> str:
    """Flow YAML nested `depth` deep (the serializer itself recurses past Python's limit)."""
    return "{k: " * depth + "x" + "}" * depth if mapping else "[" * depth + "x" + "]" * depth


def wide(size: int) -> yaml.Node:
    return yaml.MappingNode("tag:yaml.org,2002:map", [(scalar(f"k{i}"), scalar(str(i))) for i in range(size)])


@st.composite
def yaml_featured(draw):
    """A shipped file's text with one of YAML's features put in: an alias of another value, a tag,
    a merge key, an alias bomb, nesting too deep, a document too wide."""
    source = draw(st.sampled_from(SHIPPED))
    root = yaml.compose(source.read_text())
    nodes = list(nodes_of(root))
    mappings = [n for n in nodes if isinstance(n, yaml.MappingNode)]
    feature = draw(st.sampled_from(["alias", "tag", "merge", "bomb", "deep", "wide"]))
    target = draw(st.sampled_from(mappings))
    k = draw(st.integers(0, len(target.value) - 1)) if target.value else None
    if feature == "alias" and k is not None:
        target.value[k] = (target.value[k][0], draw(st.sampled_from(nodes)))
    elif feature == "tag":
        node = draw(st.sampled_from(nodes))
        node.tag = draw(st.sampled_from(TAGS))
    elif feature == "merge":
        merged = draw(st.sampled_from([*mappings, *nodes[:5], alias_bomb(2, 3)]))
        target.value.insert(0, (scalar("<<", "tag:yaml.org,2002:merge"), merged))
    elif feature == "bomb" and k is not None:
        depth = draw(st.integers(2, 12)) if LONG_RUN else draw(st.sampled_from([3, 9, 12]))
        target.value[k] = (target.value[k][0], alias_bomb(depth, 10))
    elif feature == "deep" and k is not None:
        target.value[k] = (target.value[k][0], scalar("DEEP"))
    elif feature == "wide":
        target.value.append((scalar("padding"), wide(draw(st.sampled_from([1000, 40000])))))
    with within(CASE_LIMIT_S, f"serializing {feature}"):
        text = yaml.serialize(root, width=10**9)
    if feature == "deep":
        depth = draw(st.sampled_from([50, 900, 5000]))
        text = text.replace("DEEP", nested(depth, draw(st.booleans())), 1)
    return source.name, feature, text


@fuzz(25)
@given(yaml_featured())
def test_yaml_features_in_a_shipped_file(tmp_path_factory, case):
    name, feature, text = case
    folder = case_folder(tmp_path_factory)
    (folder / name).write_text(text)
    code, _, err = answers(folder, launch_argv(folder / name))
    assert len(err) < 5000, (feature, err[:500])


# ---------------------------------------------------------------------------------------------------
# Bytes and encodings


@st.composite
def mangled_bytes(draw):
    source = draw(st.sampled_from(SHIPPED))
    text = source.read_text()
    data = text.encode()
    how = draw(
        st.sampled_from(
            ["bom8", "utf16", "utf16be", "utf32", "invalid", "nul", "control", "cut", "crlf", "latin1"]
        )
    )
    at = draw(st.integers(0, len(data)))
    if how == "bom8":
        data = b"\xef\xbb\xbf" + data
    elif how == "utf16":
        data = text.encode("utf-16")
    elif how == "utf16be":
        data = text.encode("utf-16-be")
    elif how == "utf32":
        data = text.encode("utf-32")
    elif how == "invalid":
        data = (
            data[:at]
            + draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80"]))
            + data[at:]
        )
    elif how == "nul":
        data = data[:at] + b"\x00" + data[at:]
    elif how == "control":
        data = (
            data[:at]
            + draw(st.sampled_from([b"\x07", b"\x1b", b"\x7f", b"\xc2\x85", b"\xe2\x80\xa8"]))
            + data[at:]
        )
    elif how == "cut":
        data = data[:at]
    elif how == "crlf":
        data = data.replace(b"\n", b"\r\n")
    else:
        data = text.replace("name:", "name: caf\u00e9 #").encode("latin-1", errors="replace")
    return source.name, how, data


@fuzz(15)
@given(mangled_bytes())
def test_bytes_and_encodings_of_a_shipped_file(tmp_path_factory, case):
    name, how, data = case
    folder = case_folder(tmp_path_factory)
    (folder / name).write_bytes(data)
    for argv in (launch_argv(folder / name), ["train", str(folder / name)]):
        code, _, _ = answers(folder, argv, codes=(0, 2, 4) if argv[0] == "launch" else (2,))


# ---------------------------------------------------------------------------------------------------
# Paths: the file named, and the folders a file names


def special_path(folder: Path, kind: str) -> str:
    """A path of `kind` made in `folder` (a symlink loop, a dangling link, a FIFO, ...)."""
    if kind == "loop":
        (folder / "a.yaml").symlink_to("b.yaml")
        (folder / "b.yaml").symlink_to("a.yaml")
        return str(folder / "a.yaml")
    if kind == "dangling":
        (folder / "d.yaml").symlink_to("nowhere.yaml")
        return str(folder / "d.yaml")
    if kind == "fifo":
        os.mkfifo(folder / "f.yaml")
        return str(folder / "f.yaml")
    if kind == "folder":
        (folder / "dir.yaml").mkdir()
        return str(folder / "dir.yaml")
    if kind == "link to a folder":
        (folder / "l.yaml").symlink_to(folder)
        return str(folder / "l.yaml")
    return {
        "devnull": "/dev/null",
        "devzero": "/dev/zero",
        "proc": "/proc/self/status",
        "long name": str(folder / ("x" * 300 + ".yaml")),
        "long path": str(folder / "/".join(["d" * 200] * 30)) + ".yaml",
        "missing dir": str(folder / "no" / "such" / "s.yaml"),
        "nul": str(folder / "a\x00b.yaml"),
        "empty": "",
        "under a file": str(folder / "file" / "s.yaml"),
        "unwritable": "/proc/x/y",
        "root": "/",
    }[kind]


PATH_KINDS = [
    "loop",
    "dangling",
    "fifo",
    "folder",
    "link to a folder",
    "devnull",
    "devzero",
    "proc",
    "long name",
    "long path",
    "missing dir",
    "nul",
    "empty",
    "under a file",
    "unwritable",
    "root",
]


@fuzz(20)
@given(
    st.sampled_from(PATH_KINDS),
    st.sampled_from(["launch", "nightly", "train", "storage", "storage_path", "uri"]),
)
def test_paths_a_command_or_a_file_names(tmp_path_factory, kind, where):
    """The file a command names, and each folder or file a search file names, as special paths."""
    folder = case_folder(tmp_path_factory)
    (folder / "file").write_text("")
    path = special_path(folder, kind)
    if where in ("launch", "nightly"):
        argv = [where, path, "--dry-run", "--no-calibrate"]
    elif where == "train":
        argv = ["train", path]
    else:
        data = yaml.safe_load((ROOT / "search_spaces" / "smoke.yaml").read_text())
        if where == "uri":
            data["tracking"]["uri"] = f"sqlite:///{path}"
        else:
            data[where] = path
        (folder / "s.yaml").write_text(yaml.safe_dump(data))
        argv = launch_argv(folder / "s.yaml")
    answers(folder, argv, codes=(0, 2) if kind not in ("fifo",) else (0, 2, 4))


def test_a_fifo_is_refused_in_a_process_of_its_own(tmp_path):
    """A FIFO with no writer blocks a read: the command as a shell runs it answers in time (the
    in-process cases stop at SIGALRM; this one would hang a shell)."""
    path = special_path(tmp_path, "fifo")
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "launch", path, "--dry-run", "--no-calibrate"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=CASE_LIMIT_S,
    )
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert time.monotonic() - start < CASE_LIMIT_S


# ---------------------------------------------------------------------------------------------------
# Stores in unexpected states, and URIs


def another_programs_database(path: Path) -> None:
    with contextlib.closing(sqlite3.connect(path)) as db:
        db.execute("CREATE TABLE accounts (id INTEGER, name TEXT)")
        db.commit()


def another_schema_version(path: Path) -> None:
    with contextlib.closing(sqlite3.connect(path)) as db:
        db.execute("CREATE TABLE experiments (experiment_id INTEGER)")
        db.execute("CREATE TABLE alembic_version (version_num TEXT)")
        db.execute("INSERT INTO alembic_version VALUES ('ffffffffffff')")
        db.commit()


STORE_STATES = {
    "another program's database": another_programs_database,
    "another schema version": another_schema_version,
    "empty file": lambda path: path.write_bytes(b""),
    "not a database": lambda path: path.write_text("name: not a database\n"),
    "a header and zeros": lambda path: path.write_bytes(b"SQLite format 3\x00" + bytes(4096)),
    "a header cut short": lambda path: path.write_bytes(b"SQLite format 3\x00\x10\x00"),
    "random bytes": lambda path: path.write_bytes(os.urandom(8192)),
    "read-only": lambda path: (another_schema_version(path), path.chmod(0o444)),
    "a folder": lambda path: path.mkdir(),
    "a fifo": lambda path: os.mkfifo(path),
}


@fuzz(12)
@given(st.sampled_from(sorted(STORE_STATES)), st.sampled_from(["file", "flag", "environment"]))
def test_a_tracking_store_in_an_unexpected_state(tmp_path_factory, state, given_by):
    folder = case_folder(tmp_path_factory)
    STORE_STATES[state](folder / "store.db")
    uri = f"sqlite:///{folder / 'store.db'}"
    data = yaml.safe_load((ROOT / "search_spaces" / "smoke.yaml").read_text())
    if given_by == "file":
        data["tracking"]["uri"] = uri
    (folder / "s.yaml").write_text(yaml.safe_dump(data))
    argv = launch_argv(folder / "s.yaml") + (["--tracking-uri", uri] if given_by == "flag" else [])
    with pytest.MonkeyPatch.context() as env:
        if given_by == "environment":
            env.setenv("MLFLOW_TRACKING_URI", uri)
        answers(folder, argv)


# Never answers, whatever the wait: exit 2 at once, not retried as an outage (exit 4 after the window).
NEVER = [
    "http://127.0.0.1:99999",
    "http://127.0.0.1:65536",
    "http://127.0.0.1:-1",
    "http://127.0.0.1:port",
    "http://[::1",
    "http://",
    "https:///path",
    "http://user:pa:ss@@127.0.0.1:5000",
    "postgresql://u@127.0.0.1:99999/db",
    "postgresql://u@127.0.0.1:x/db",
    "postgresql://u@[::1/db",
    "mysql://u@127.0.0.1:99999/db",
    "sqlite:///" + "x" * 300 + "/m.db",
    "sqlite:///a\x00b.db",
    "sqlite://",
    "ftp://127.0.0.1/x",
    "file:///tmp/x",
    "databricks",
    "http://127.0.0.1:5000\n",
]
# May answer later (nothing listens now): exit 4 once the retry window closes.
MAYBE_LATER = ["http://127.0.0.1:9", "postgresql://u@127.0.0.1:9/db"]


@fuzz(16)
@given(st.sampled_from(NEVER + MAYBE_LATER), st.sampled_from(["file", "flag", "environment"]))
def test_a_uri_that_can_never_answer_is_refused_at_once(tmp_path_factory, uri, given_by):
    assume(given_by != "environment" or "\x00" not in uri)  # the environment cannot hold a NUL
    folder = case_folder(tmp_path_factory)
    data = yaml.safe_load((ROOT / "search_spaces" / "smoke.yaml").read_text())
    if given_by == "file":
        data["tracking"]["uri"] = uri
    (folder / "s.yaml").write_text(yaml.safe_dump(data))
    argv = launch_argv(folder / "s.yaml") + (["--tracking-uri", uri] if given_by == "flag" else [])
    with pytest.MonkeyPatch.context() as env:
        env.setenv("SYSGEN_STORE_RETRY_S", "1")
        if given_by == "environment":
            env.setenv("MLFLOW_TRACKING_URI", uri)
        start = time.monotonic()
        code, _, err = answers(folder, argv)
    if uri in NEVER:
        assert code == 2 and time.monotonic() - start < 5, (uri, code, err)
    else:
        assert code == 4, (uri, code, err)


# ---------------------------------------------------------------------------------------------------
# Model files (`model: path/to/file.py:Class`)

MODEL_FILES = {
    "missing": None,
    "unparsable": "def (:\n",
    "raising on import": "raise RuntimeError('boom')\n",
    "importing what is not there": "import no_such_module_here\n",
    "exiting on import": "import sys\nsys.exit(3)\n",
    "not UTF-8": b"\xff\xfe\x00class Net: pass\n",
    "empty": "",
    "the class is not a class": "Net = 5\n",
    "the class is not a module": "class Net:\n    pass\n",
    "a module without a Config": "import torch\nclass Net(torch.nn.Module):\n    pass\n",
    "a Config that is not a dataclass": (
        "import torch\nclass Net(torch.nn.Module):\n    Config = dict\n    kinds = ()\n"
    ),
}


@fuzz(15)
@given(
    st.sampled_from(sorted(MODEL_FILES)),
    st.sampled_from(["m.py:Net", "m.py:Other", "m.py:", "m.py:Net:x", "./m.py:Net"]),
    st.sampled_from(["launch", "train"]),
)
def test_a_model_file_that_cannot_be_used(tmp_path_factory, kind, name, command):
    folder = case_folder(tmp_path_factory)
    content = MODEL_FILES[kind]
    if content is not None:
        (folder / "m.py").write_bytes(content if isinstance(content, bytes) else content.encode())
    if command == "train":
        argv = ["train", f"ctl/{name}", "--set", "n_iters=1"]
    else:
        data = yaml.safe_load((ROOT / "search_spaces" / "smoke.yaml").read_text())
        data["models"] = ["panm", name]
        data["per_model"].pop("lstm_seq2seq")
        (folder / "s.yaml").write_text(yaml.safe_dump(data))
        argv = launch_argv(folder / "s.yaml")
    answers(folder, argv, codes=(2,))


# ---------------------------------------------------------------------------------------------------
# `orchestrator train --set KEY=VALUE`

SET_KEYS = st.one_of(
    st.sampled_from(
        [
            "lr",
            "n_iters",
            "batch_size",
            "seed",
            "device",
            "model",
            "task",
            "task_options",
            "n_layers",
            "d_model",
            "dropout",
            "threads",
            "eval_every",
            "task_options.eval_size",
            "lr.x",
            "",
            " ",
            "a.b.c",
        ]
    ),
    NAMES,
)
SET_VALUES = st.one_of(
    st.sampled_from(
        [
            ".nan",
            ".inf",
            "-.inf",
            "1e999",
            "-1",
            "0",
            "99999999999999999999",
            "true",
            "null",
            "~",
            "[1",
            "{a: 1}",
            "!!python/object:os.system x",
            "&a [*a]",
            "[" * 3000,
            "'",
            "\x00",
            "1e-3",
            "cpu",
            "a\tb",
        ]
    ),
    st.text(max_size=30),
)


class WouldTrain(Exception):
    """Raised where `train` would start training: every input was checked by then."""


def reached_training(cfg):
    raise WouldTrain


@fuzz(30)
@given(
    st.sampled_from(["ctl/lstm", "copy/panm", "ctl/ndr", "scan/transformer_enc_dec"]),
    st.lists(st.tuples(SET_KEYS, SET_VALUES), min_size=1, max_size=3),
)
def test_train_set_values(tmp_path_factory, source, assignments):
    folder = case_folder(tmp_path_factory)
    argv = ["train", source, "--set", "n_iters=1"] + [
        a for k, v in assignments for a in ("--set", f"{k}={v}")
    ]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("orchestrator.cli.train.train", reached_training)
        try:
            answers(folder, argv, codes=(2,))
        except WouldTrain:
            pass


# ---------------------------------------------------------------------------------------------------
# Command arguments: every command, on a launch of a real store; the servers (dashboard, ui) up to
# where they would serve


@pytest.fixture(scope="module")
def a_launch(tmp_path_factory):
    """A finished search launch in a SQLite MLflow store (test_status.launch, with the tags a launch's
    trials carry) and its pair's Optuna study (what the dashboard serves): its folder, and its id."""
    import optuna
    from mlflow.tracking import MlflowClient
    from test_status import SEARCH, launch

    from orchestrator.record.optuna_store import search_storage

    folder = tmp_path_factory.mktemp("launch")
    runs = {((), seed): ("completed", 0.5 + seed / 10, 0.4) for seed in range(3)}
    state = launch(folder, SEARCH, runs)
    client = MlflowClient(state.tracking_uri)
    pair = state.study().pairs[0]
    optuna.create_study(
        study_name=state.optuna_study_name(pair.name), storage=search_storage(state.tracking_uri, state.dir)
    )
    for run in client.search_runs([client.get_experiment_by_name(state.experiment).experiment_id]):
        for key, value in {"model": pair.model, "task": pair.task.task, "variant": pair.task.variant}.items():
            client.set_tag(run.info.run_id, key, value)
    return folder, state.launch_id


ARGUMENT_VALUES = st.one_of(
    NAMES, st.sampled_from(["runs", "previous", "csv", "parquet", "x.csv", "/dev/null", "/proc/x", "-h"])
)
OPTIONS = {
    "status": ["--storage-path"],
    "best": ["--storage-path", "--ablation"],
    "report": ["--storage-path", "--compare", "--mlflow-url"],
    "export": ["--storage-path", "--format", "--output"],
    "board": ["--storage-path", "--tracking-uri", "--output", "--docs", "--mlflow-url", "--no-links"],
    "list": ["--storage-path"],
    "accept": ["--storage-path"],
    "resume": ["--storage-path", "--address"],
    "launch": ["--address", "--tracking-uri", "--storage", "--launch-id"],
    "nightly": ["--address", "--tracking-uri", "--storage", "--launch-id"],
    "train": ["--set"],
    "dashboard": ["--storage-path", "--host", "--port"],
    "ui": ["--storage-path", "--port"],
}


@st.composite
def command_lines(draw):
    command = draw(st.sampled_from(sorted(OPTIONS)))
    argv = [command]
    if command in ("launch", "nightly"):
        argv += ["s.yaml", "--dry-run", "--no-calibrate"]
    elif command == "list":
        argv.append(draw(st.one_of(st.sampled_from(["tasks", "models", "presets", "launches"]), NAMES)))
    elif command == "train":
        argv.append(draw(st.one_of(st.sampled_from(["ctl/lstm", "ctl/", "/", "ctl/lstm/x"]), NAMES)))
    elif command != "board":
        # resume never gets the launch: a resume that passes its checks starts Ray
        argv.append(draw(st.one_of(st.just("{launch}"), NAMES) if command != "resume" else NAMES))
    for option in draw(st.lists(st.sampled_from(OPTIONS[command]), max_size=2, unique=True)):
        if option == "--no-links":
            argv.append(option)
        elif option == "--address":
            argv += [
                option,
                draw(st.sampled_from(["127.0.0.1:9", "127.0.0.1:99999", "x:y", ":", "[::1", "auto"])),
            ]
        elif option == "--port":
            argv += [option, draw(st.one_of(st.sampled_from(["0", "1", "65535", "65536", "-1", "x"]), NAMES))]
        elif option == "--host":
            argv += [option, draw(st.one_of(st.sampled_from(["127.0.0.1", "0.0.0.0", "::1", "x y"]), NAMES))]
        elif option in ("--tracking-uri", "--mlflow-url"):
            argv += [option, draw(st.sampled_from(NEVER + MAYBE_LATER + ["http://127.0.0.1:5000"]))]
        else:
            argv += [option, draw(ARGUMENT_VALUES)]
    return argv


def test_the_fuzzed_commands_are_every_command():
    assert set(OPTIONS) == {command.name for command in COMMANDS}


class WouldServe(Exception):
    """Raised where a server command would start serving: every input was checked by then."""


def dashboard_bound(app, host, port):
    """Where bottle.run would serve: it binds first, which fails as bottle's own bind would."""
    socket.create_server((host, port)).close()
    raise WouldServe


class UiServer:
    def __init__(self, uri, port):
        pass

    def __enter__(self):
        raise WouldServe

    def __exit__(self, *exc):
        return False


def answers_up_to_serving(tmp_path_factory, a_launch, argv) -> bool:
    """The command's answer, or True where it reached a server's serving line (or trained)."""
    source, launch_id = a_launch
    folder = case_folder(tmp_path_factory)
    shutil.copytree(source, folder, dirs_exist_ok=True, symlinks=True)
    argv = [a.replace("{launch}", launch_id) for a in argv]
    if argv[0] == "resume" and "--storage-path" not in argv:
        argv += ["--storage-path", "no-launches-here"]
    with pytest.MonkeyPatch.context() as env:
        env.setenv("SYSGEN_STORE_RETRY_S", "1")
        env.delenv("MLFLOW_TRACKING_URI", raising=False)
        env.setattr("orchestrator.cli.train.train", reached_training)
        env.setattr("bottle.run", dashboard_bound)
        env.setattr("orchestrator.cli.ui.Server", UiServer)
        try:
            answers(folder, argv, codes=(0, 1, 2, 4) if argv[0] == "report" else (0, 2, 4))
        except (WouldTrain, WouldServe):
            return True
    return False


@fuzz(25)
@given(command_lines())
def test_command_arguments(tmp_path_factory, a_launch, argv):
    answers_up_to_serving(tmp_path_factory, a_launch, argv)


@pytest.mark.parametrize(
    "argv",
    [["ui", "{launch}", "--port", "0"], ["dashboard", "{launch}", "--host", "127.0.0.1", "--port", "0"]],
    ids=["ui", "dashboard"],
)
def test_the_servers_are_reached_with_good_arguments(tmp_path_factory, a_launch, argv):
    """Few drawn cases get every argument of a server right: these do, so the stubs above are known to
    stand where each server would serve."""
    assert answers_up_to_serving(tmp_path_factory, a_launch, argv)


def mlflow_store_with(change):
    """A state of a copy of the launch's own MLflow store: `change(path)` applied to it."""

    def made(path: Path, store: Path) -> None:
        shutil.copyfile(store, path)
        change(path)

    return made


def newer_schema(path: Path) -> None:
    with contextlib.closing(sqlite3.connect(path)) as db:
        db.execute("UPDATE alembic_version SET version_num = 'ffffffffffff'")
        db.commit()


def cut_in_half(path: Path) -> None:
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size // 2)


LAUNCH_STORE_STATES = {
    **{name: lambda path, store, make=make: make(path) for name, make in STORE_STATES.items()},
    "a newer schema version": mlflow_store_with(newer_schema),
    "cut in half": mlflow_store_with(cut_in_half),
    "its tables dropped": mlflow_store_with(
        lambda path: [sqlite3.connect(path).execute(f"DROP TABLE {t}") for t in ("metrics", "latest_metrics")]
    ),
    "missing": lambda path, store: None,
}


@fuzz(16)
@given(
    st.sampled_from(sorted(LAUNCH_STORE_STATES)),
    st.sampled_from([["status"], ["best"], ["export"], ["report"], ["export", "--format", "parquet"]]),
)
def test_a_launchs_store_in_an_unexpected_state(tmp_path_factory, a_launch, state, command):
    """The commands that read a launch, on its store in each state."""
    source, launch_id = a_launch
    folder = case_folder(tmp_path_factory)
    shutil.copytree(source, folder, dirs_exist_ok=True, symlinks=True)
    (folder / "mlflow.db").unlink()
    record = folder / "runs" / launch_id / "launch.json"
    fields = json.loads(record.read_text())
    fields["tracking_uri"] = f"sqlite:///{folder / 'mlflow.db'}"
    record.write_text(json.dumps(fields))
    LAUNCH_STORE_STATES[state](folder / "mlflow.db", source / "mlflow.db")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("SYSGEN_STORE_RETRY_S", "1")
        env.delenv("MLFLOW_TRACKING_URI", raising=False)
        answers(folder, [*command[:1], launch_id, *command[1:]])
