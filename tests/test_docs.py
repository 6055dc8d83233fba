"""The documentation's generated reference (orchestrator/reference.py): every key a search-space file
may hold is on its page, found from what the parser reads rather than from the generator's own lists;
the papers' numbers, the commands, the exit statuses and every environment variable the code reads
are all there; and the committed pages are what `make reference` writes now."""

import ast
import dataclasses
import re
from pathlib import Path

from orchestrator import reference
from orchestrator.cli.parser import parser_and_commands
from orchestrator.plan import sections, study
from orchestrator.run import exits
from trainables.config import TRAIN_KEYS
from trainables.models import MODELS

ROOT = Path(__file__).resolve().parent.parent


def sections_the_parser_reads() -> dict[str, str]:
    """Each `_section(Class, raw, "key", path)` call of plan/sections.py: key -> the class's name."""
    tree = ast.parse((ROOT / "orchestrator" / "plan" / "sections.py").read_text())
    return {
        call.args[2].value: call.args[0].id
        for call in ast.walk(tree)
        if isinstance(call, ast.Call)
        and getattr(call.func, "id", None) == "_section"
        and isinstance(call.args[2], ast.Constant)
    }


def test_every_key_a_file_may_hold_is_on_the_search_space_page():
    page = reference.search_space_page()
    missing = [key for key in sections.TOP_KEYS if f"| `{key}` |" not in page]
    missing += [f"per_model.{key}" for key in sections.PER_MODEL_KEYS if f"`{key}`" not in page]
    for section, class_name in sections_the_parser_reads().items():
        for f in dataclasses.fields(getattr(study, class_name)):
            if f"| `{section}.{f.name}` |" not in page:
                missing.append(f"{section}.{f.name}")
    missing += [key for key in TRAIN_KEYS if f"| `{key}` |" not in page]
    for model, model_spec in MODELS.items():
        own = page[page.index(f"### {model}\n") :]
        missing += [
            f"{model}.{f.name}" for f in dataclasses.fields(model_spec.config) if f"| `{f.name}` |" not in own
        ]
    assert not missing, missing


def test_every_command_and_option_is_on_the_commands_page():
    page = reference.cli_page()
    _, commands = parser_and_commands()
    assert all(f"## {name}\n" in page for name in commands)
    for name, parser in commands.items():
        for line in parser.format_usage().split():
            if line.startswith("--"):
                assert line.strip("[]") in page, (name, line)
    assert all(f"| {code} |" in page for code in (0, 1, 2, 3, 4, 130))


def test_every_published_number_is_on_its_page():
    import yaml

    page = reference.published_page()
    cells = yaml.safe_load((ROOT / "orchestrator" / "report" / "published.yaml").read_text())
    assert page.count("\n| ") - page.count("\n| model |") == len(cells)


def test_the_committed_pages_are_what_make_reference_writes(tmp_path):
    """README.md and docs/ hold the generated text as committed: regenerated into a folder, every page
    reads the same. A changed option, model, key or exit status fails here until its pages are
    written again."""
    written = reference.write(ROOT, tmp_path)
    assert {Path("README.md"), Path("docs/reference/cli.md"), Path("docs/guide/faults.md")} <= set(written)
    stale = [str(page) for page in written if (tmp_path / page).read_text() != (ROOT / page).read_text()]
    assert not stale, f"stale generated text in {', '.join(stale)}: run `{reference.COMMAND}`"
    pipes_in_code = [
        (str(page), m.group())
        for page in written
        for m in re.finditer(r"`[^`\n]*\\\|[^`\n]*`", (tmp_path / page).read_text())
    ]
    assert not pipes_in_code, pipes_in_code  # a site shows the backslash of `int \| None`


def test_every_exit_status_is_on_the_commands_page():
    page = reference.cli_page()
    assert all(f"| {status} |" in page for status in exits.STATUSES)


def module_strings(tree: ast.Module) -> dict[str, str]:
    """A module's `NAME = "text"` constants."""
    return {
        node.targets[0].id: node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        and isinstance(node.targets[0], ast.Name)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
    }


def is_environ(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "environ"


def variables_read(path: Path) -> set[str]:
    """The environment variables a Python file names to os.environ or os.getenv (directly or by a
    module constant), and those a default such as `data_dir: "$BABI_DATA"` expands."""
    tree = ast.parse(path.read_text())
    strings, named = module_strings(tree), []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
            if is_environ(node.func.value) or node.func.attr == "getenv":
                named.append(node.args[0])
        elif isinstance(node, ast.Subscript) and is_environ(node.value):
            named.append(node.slice)
        elif isinstance(node, ast.Constant) and re.fullmatch(r"\$[A-Z][A-Z0-9_]*", str(node.value)):
            named.append(ast.Constant(node.value[1:]))
    found = {strings.get(n.id) if isinstance(n, ast.Name) else getattr(n, "value", None) for n in named}
    return {name for name in found if isinstance(name, str)}


SYSTEM = {"PATH", "TMPDIR"}  # the system's, which the tests and scripts pass on


def test_every_environment_variable_the_code_reads_is_on_its_page():
    """Every variable the service's code, its benchmarks and tests, and its deploy scripts read is in
    reference.ENVIRONMENT, which the environment page prints. (The benchmarks' device scripts take
    their knobs from the environment too: their own headers list those.)"""
    read = set()
    for folder in ("orchestrator", "trainables", "benchmarks", "deploy", "tests"):
        for path in (ROOT / folder).rglob("*.py"):
            read |= {(name, path.relative_to(ROOT)) for name in variables_read(path)}
    for path in (ROOT / "deploy").rglob("*.sh"):
        names = set(re.findall(r"\$\{([A-Z][A-Z0-9_]*)", path.read_text())) - SYSTEM
        read |= {(name, path.relative_to(ROOT)) for name in names}
    found = {name for name, _ in read}
    assert found >= {"SYSGEN_DATA_CACHE", "SYSGEN_STORE_RETRY_S", "MLFLOW_DB", "BABI_DATA", "RAY_ADDRESS"}
    listed = {v.name for v in reference.ENVIRONMENT}
    assert not {(name, str(path)) for name, path in read if name not in listed | SYSTEM}
    page = reference.environment_page()
    assert all(f"| `{name}` |" in page for name in listed)
