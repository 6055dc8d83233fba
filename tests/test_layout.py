"""The code's layering: trainables never import the orchestrator, and the orchestrator's packages
import one way (plan <- record <- report <- run <- cli), and no module of either reaches
itself through the modules it imports."""

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Each package and what it may import besides itself.
ALLOWED = {
    "plan": set(),
    "record": {"plan"},
    "report": {"plan", "record"},
    "run": {"plan", "record", "report"},
}


def orchestrator_imports(path: Path) -> set[str]:
    """The orchestrator packages `path` imports (relative or absolute, at the top or in a function)."""
    package = path.relative_to(ROOT / "orchestrator").parts[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1:
                found.add(package)
            elif node.level == 2:  # from ..record.state import x, or from ..record import runs, state
                found |= {node.module.split(".")[0]} if node.module else {a.name for a in node.names}
            elif node.module and node.module.startswith("orchestrator."):
                found.add(node.module.split(".")[1])
            elif node.module == "orchestrator":  # from orchestrator import run
                found |= {a.name for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[1] for a in node.names if a.name.startswith("orchestrator.")}
    return found


def test_the_orchestrator_packages_import_one_way():
    wrong = []
    for package, allowed in ALLOWED.items():
        for path in sorted((ROOT / "orchestrator" / package).glob("*.py")):
            if bad := orchestrator_imports(path) - allowed - {package}:
                wrong.append(f"{path.relative_to(ROOT)} imports {sorted(bad)}")
    assert not wrong, wrong


def test_every_spelling_of_an_import_is_seen(tmp_path, monkeypatch):
    package = tmp_path / "orchestrator" / "plan"
    package.mkdir(parents=True)
    spellings = {
        "from orchestrator import run": {"run"},
        "from orchestrator.run import launch": {"run"},
        "import orchestrator.run.launch": {"run"},
        "from ..run import launch": {"run"},
        "from . import spec": {"plan"},
    }
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    for code, packages in spellings.items():
        (package / "spec.py").write_text(f"def f():\n    {code}\n")
        assert orchestrator_imports(package / "spec.py") == packages, code


def test_trainables_import_nothing_from_the_orchestrator():
    wrong = [
        str(p.relative_to(ROOT))
        for p in (ROOT / "trainables").rglob("*.py")
        if any(
            isinstance(n, (ast.Import, ast.ImportFrom)) and "orchestrator" in ast.unparse(n)
            for n in ast.walk(ast.parse(p.read_text()))
        )
    ]
    assert not wrong, wrong


def test_trainables_import_neither_ray_nor_mlflow_nor_optuna():
    """Their glue stays in the orchestrator: a model or task runs with torch alone (as on the GPU machine)."""
    glue = ("ray", "mlflow", "optuna")
    wrong = [
        f"{p.relative_to(ROOT)}: {ast.unparse(n)}"
        for p in (ROOT / "trainables").rglob("*.py")
        for n in ast.walk(ast.parse(p.read_text()))
        if isinstance(n, ast.Import)
        and any(a.name.split(".")[0] in glue for a in n.names)
        or isinstance(n, ast.ImportFrom)
        and n.level == 0
        and (n.module or "").split(".")[0] in glue
    ]
    assert not wrong, wrong


def module_of(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, known: set[str]) -> set[str]:
    """The modules of `known` that `path` imports, at the top or in a function: `from .x import y`
    counts y where y is a module of its own, else x."""
    here = module_of(path).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = (
                ".".join([*package[: len(package) - node.level + 1], *([node.module] if node.module else [])])
                if node.level
                else node.module
            )
            found |= {f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names}
    return found & known


def test_no_import_circle_between_modules():
    """A module that needs another's function imports it; two that need each other's belong apart
    (DEVELOPERS.md): no module reaches itself through the imports of its package's modules."""
    paths = [*(ROOT / "trainables").rglob("*.py"), *(ROOT / "orchestrator").rglob("*.py")]
    known = {module_of(p) for p in paths}
    imports = {module_of(p): imported_modules(p, known) - {module_of(p)} for p in paths}
    circles = []
    for start in sorted(imports):
        seen, frontier = set(), [(start, (start,))]
        while frontier:
            module, route = frontier.pop()
            for next_module in sorted(imports[module]):
                if next_module == start:
                    circles.append(" -> ".join((*route, start)))
                elif next_module not in seen:
                    seen.add(next_module)
                    frontier.append((next_module, (*route, next_module)))
    assert not circles, circles


def test_no_function_is_longer_than_a_reader_can_hold():
    """The house rule ruff cannot keep: no function of the service over 60 lines (its def to its
    last line), so that each reads on one screen."""
    too_long = []
    for path in sorted(
        [*ROOT.glob("orchestrator/**/*.py"), *ROOT.glob("trainables/**/*.py"), *ROOT.glob("examples/*.py")]
    ):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                and node.end_lineno - node.lineno >= 60
            ):
                too_long.append(
                    f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {node.end_lineno - node.lineno + 1}"
                )
    assert not too_long, too_long


# The commands that read launches: as quick as their files and the tracking store, without torch.
READERS = ("list", "status", "best", "accept", "report", "export", "board")


def test_the_commands_that_read_launches_and_the_plans_they_read_import_no_torch():
    """Their modules, and each shipped file's plan read again as a launch ran it (judged, not built),
    go without torch's seconds of imports: a kind, a task and a model's config reach torch only
    where a step, a build or an attention map needs it. In a process of its own, as this one has
    torch already; the shipped files that need no data of their own name every model."""
    code = f"""
        import glob, importlib, sys
        from orchestrator.cli.parser import COMMANDS
        from orchestrator.plan.load import load_study
        from orchestrator.plan.source import SpecError
        from trainables.models import MODELS

        for command in COMMANDS:
            if command.name in {READERS!r}:
                importlib.import_module("orchestrator.cli." + command.run.split(":")[0])
        models = set()
        for path in sorted(glob.glob("ablations/*.yaml") + glob.glob("search_spaces/*.yaml")):
            try:
                models |= {{pair.model for pair in load_study(path, recorded=True).pairs}}
            except SpecError:  # a task's data folder (bAbI, Multi30K) this machine lacks
                pass
        assert models == set(MODELS), set(MODELS) - models
        print(sorted(m for m in sys.modules if m.split(".")[0] == "torch"))
    """
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", f"torch imported: {done.stdout}"
