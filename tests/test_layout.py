"""The code's layering: trainables never import the orchestrator, and the orchestrator's packages
import one way (plan <- record <- report <- run <- cli), so no import circle can form."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Each package and what it may import besides itself.
ALLOWED = {"plan": set(), "record": {"plan"}, "report": {"plan", "record"}, "run": {"plan", "record", "report"}}


def orchestrator_imports(path: Path) -> set[str]:
    """The orchestrator packages `path` imports (relative or absolute, at the top or in a function)."""
    package = path.relative_to(ROOT / "orchestrator").parts[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1:
                found.add(package)
            elif node.level == 2:  # from ..record.state import x, or from ..record import tracking, state
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
    spellings = {"from orchestrator import run": {"run"}, "from orchestrator.run import launch": {"run"},
                 "import orchestrator.run.launch": {"run"}, "from ..run import launch": {"run"}, "from . import spec": {"plan"}}
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    for code, packages in spellings.items():
        (package / "spec.py").write_text(f"def f():\n    {code}\n")
        assert orchestrator_imports(package / "spec.py") == packages, code


def test_trainables_import_nothing_from_the_orchestrator():
    wrong = [str(p.relative_to(ROOT)) for p in (ROOT / "trainables").rglob("*.py")
             if any(isinstance(n, (ast.Import, ast.ImportFrom)) and "orchestrator" in ast.unparse(n) for n in ast.walk(ast.parse(p.read_text())))]
    assert not wrong, wrong
