"""Bad input never gets through: mutated shipped files are launchable or refused with one line."""
import contextlib
import io
import os
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings, strategies as st

from orchestrator import cli

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = sorted([*(ROOT / "search_spaces").glob("*.yaml"), *(ROOT / "ablations").glob("*.yaml")])

odd_values = st.one_of(
    st.none(), st.booleans(), st.integers(-5, 10**6), st.floats(-2.0, 2.0, allow_nan=False),
    st.sampled_from(["", "it's", "../x", "a b", "ndr", "copy", "lstm", "sqlite:///x.db", "1e-3", "a\"b"]),
    st.lists(st.integers(-3, 100), max_size=3), st.dictionaries(st.sampled_from(["low", "x", "uniform"]), st.integers(-1, 3), max_size=2),
)


def paths_of(node, prefix=()):
    """Every (path to a key or item) in a parsed YAML document."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield (*prefix, k)
            yield from paths_of(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield (*prefix, i)
            yield from paths_of(v, (*prefix, i))


@st.composite
def mutated_files(draw):
    source = draw(st.sampled_from(SHIPPED))
    data = yaml.safe_load(source.read_text())
    for _ in range(draw(st.integers(1, 2))):
        paths = list(paths_of(data))
        where = draw(st.sampled_from(paths))
        parent = data
        for step in where[:-1]:
            parent = parent[step]
        last = where[-1]
        action = draw(st.sampled_from(["value", "delete", "rename", "reverse"]))
        if action == "delete":
            del parent[last]
        elif action == "rename" and isinstance(parent, dict):
            parent[draw(st.sampled_from(["nme", "modles", "n_layer", "lr ", "grid", "optimiser"]))] = parent.pop(last)
        elif action == "reverse" and isinstance(parent[last], list):
            parent[last] = parent[last][::-1]
        else:
            parent[last] = draw(odd_values)
    return source.name, yaml.safe_dump(data)


@settings(max_examples=int(os.environ.get("BAD_INPUT_EXAMPLES", 60)), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(mutated_files())
def test_a_mutated_file_is_launchable_or_refused_in_one_line_with_nothing_written(tmp_path_factory, case):
    name, text = case
    folder = tmp_path_factory.mktemp("case")
    path = folder / name
    path.write_text(text)
    before = set(os.listdir(folder))
    out, err = io.StringIO(), io.StringIO()
    cwd = os.getcwd()
    os.chdir(folder)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli.main(["launch", str(path), "--dry-run", "--no-calibrate"])
    finally:
        os.chdir(cwd)
    if code == 0:
        assert err.getvalue() == "", err.getvalue()
        return
    assert code == 2
    lines = err.getvalue().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"orchestrator: error: {path}"), err.getvalue()
    assert set(os.listdir(folder)) == before, "a refused file wrote something"
