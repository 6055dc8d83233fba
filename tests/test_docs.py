"""The documentation's generated reference (orchestrator/reference.py): every key a search-space file
may hold is on its page, found from what the parser reads rather than from the generator's own lists;
and the papers' numbers and the commands are all there."""

import ast
import dataclasses
from pathlib import Path

from orchestrator import reference
from orchestrator.cli import parser_and_commands
from orchestrator.plan import spec
from trainables.config import TRAIN_KEYS
from trainables.models import MODELS

ROOT = Path(__file__).resolve().parent.parent


def sections_the_parser_reads() -> dict[str, str]:
    """Each `_section(Class, raw, "key", path)` call of plan/spec.py: key -> the class's name."""
    tree = ast.parse((ROOT / "orchestrator" / "plan" / "spec.py").read_text())
    return {
        call.args[2].value: call.args[0].id
        for call in ast.walk(tree)
        if isinstance(call, ast.Call)
        and getattr(call.func, "id", None) == "_section"
        and isinstance(call.args[2], ast.Constant)
    }


def test_every_key_a_file_may_hold_is_on_the_search_space_page():
    page = reference.search_space_page()
    missing = [key for key in spec.TOP_KEYS if f"| `{key}` |" not in page]
    missing += [f"per_model.{key}" for key in spec.PER_MODEL_KEYS if f"`{key}`" not in page]
    for section, class_name in sections_the_parser_reads().items():
        for f in dataclasses.fields(getattr(spec, class_name)):
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
