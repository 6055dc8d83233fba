"""The documentation's reference pages, generated from the definitions the service itself reads, so
that they cannot drift: every command and option from the argparse parser (`cli.build_parser`), every
search-space key from the spec's sections and the trial configs' dataclasses, the tasks, models and
presets, and the papers' published numbers. The docs site's hook (`mkdocs_hooks.py`) puts each where
its page says `<!-- reference: NAME -->`; `tests/test_docs.py` checks that nothing is left out."""

from __future__ import annotations

import dataclasses
from importlib import resources

import yaml

from trainables.config import TRAIN_KEYS, TrainConfig, preset_models
from trainables.models import MODELS
from trainables.tasks import TASKS

from .cli import parser_and_commands
from .plan.spec import (
    PER_MODEL_KEYS,
    TOP_KEYS,
    Budget,
    Confirm,
    Report,
    Resources,
    Scheduler,
    Tracking,
)

SECTIONS = {
    "budget": Budget,
    "scheduler": Scheduler,
    "resources": Resources,
    "tracking": Tracking,
    "report": Report,
    "confirm": Confirm,
}
EXIT_STATUSES = {
    0: "done (a launch: finished, every trial completed)",
    1: "a regression flagged (`report --compare`, `nightly`); a trial `train` ran did not complete",
    2: "bad input: one line naming the file, key and reason; nothing launched or written",
    3: "a launch finished and answered, but trials failed, or every run of a pair diverged or failed",
    4: "a store (MLflow's, Optuna's, trial storage) stayed unreachable: `orchestrator resume` continues",
    130: "stopped by Ctrl-C (or SIGTERM): `orchestrator resume` continues",
}


def cell(text) -> str:
    """A value as a Markdown table cell shows it."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def cli_page() -> str:
    """Every command as `orchestrator COMMAND --help` prints it; then the exit statuses."""
    parser, commands = parser_and_commands()
    out = ["```text", parser.format_help().strip(), "```", ""]
    for name, sub in commands.items():
        out += [f"## {name}", "", "```text", sub.format_help().strip(), "```", ""]
    out += ["## Exit statuses", "", "| status | meaning |", "|---|---|"]
    out += [f"| {code} | {meaning} |" for code, meaning in EXIT_STATUSES.items()]
    return "\n".join(out) + "\n"


def default_of(f: dataclasses.Field):
    if f.default is not dataclasses.MISSING:
        return f.default
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else None


def field_rows(prefix: str, fields) -> list[str]:
    """Dataclass fields as rows: the key, its type, its default, an example line of YAML."""
    rows = []
    for f in fields:
        default = default_of(f)
        example = yaml.safe_dump({f.name: default}, default_flow_style=True).strip()[1:-1]
        rows.append(f"| `{prefix}{f.name}` | `{cell(f.type)}` | `{cell(default)}` | `{cell(example)}` |")
    return rows


def search_space_page() -> str:
    """The file's top-level keys, each section's keys, and the keys a trial takes (in fixed, space,
    grid and per_model), the shared ones and each model's own."""
    out = ["## Top-level keys", "", "| key | what it holds |", "|---|---|"]
    out += [f"| `{key}` | {cell(text)} |" for key, text in TOP_KEYS.items()]
    out += ["", "`per_model.<model>` takes " + ", ".join(f"`{k}`" for k in PER_MODEL_KEYS) + "."]
    for name, cls in SECTIONS.items():
        out += ["", f"## {name}", "", "| key | type | default | example |", "|---|---|---|---|"]
        out += field_rows(f"{name}.", dataclasses.fields(cls))
    shared = [f for f in dataclasses.fields(TrainConfig) if f.name in TRAIN_KEYS]
    out += ["", "## Trial keys every model takes", "", "In `fixed`, `space`, `grid` and `per_model`."]
    out += ["", "| key | type | default | example |", "|---|---|---|---|"]
    out += field_rows("", shared)
    for model, spec in MODELS.items():
        out += ["", f"### {model}", "", cell(spec.description), ""]
        fields = dataclasses.fields(spec.config)
        out += ["| key | type | default | example |", "|---|---|---|---|", *field_rows("", fields)]
    return "\n".join(out) + "\n"


def catalogue_page() -> str:
    """What `orchestrator list tasks|models|presets` prints, as tables."""
    out = ["## Tasks", "", "| task | kind | scores | options |", "|---|---|---|---|"]
    for name, spec in TASKS.items():
        options = ", ".join(f"`{f.name}`" for f in dataclasses.fields(spec.config))
        out.append(f"| `{name}` | {spec.kind.name} | {'/'.join(spec.kind.scores)} | {options} |")
    out += ["", "## Models", "", "| model | kinds it runs | what it is |", "|---|---|---|"]
    for name, spec in MODELS.items():
        out.append(f"| `{name}` | {', '.join(map(str, spec.kinds))} | {cell(spec.description)} |")
    out += ["", "## Presets", "", "The papers' settings, `orchestrator train TASK/MODEL`.", ""]
    out += ["| task | presets |", "|---|---|"]
    out += [
        f"| `{task}` | {' '.join(f'`{task}/{m}`' for m in models)} |"
        for task, models in preset_models().items()
    ]
    return "\n".join(out) + "\n"


def published_page() -> str:
    """The papers' numbers the reports put beside ours (orchestrator/report/published.yaml), a table
    per paper's table."""
    cells = yaml.safe_load(resources.files("orchestrator.report").joinpath("published.yaml").read_text())
    out, shown = [], None
    for c in cells:
        if (c["paper"], c["table"]) != shown:
            shown = (c["paper"], c["table"])
            out += ["", f"## {PAPERS.get(c['paper'], c['paper'])}, {c['table']}", ""]
            out += [
                "| model | task (variant) | split | score | setting | published |",
                "|---|---|---|---|---|---|",
            ]
        setting = ", ".join(f"{k}={v}" for k, v in (c.get("setting") or {}).items())
        number = f"{c['mean']:g}" + (f" ± {c['std']:g}" if c.get("std") is not None else "")
        task = c["task"] + (f" ({c['variant']})" if c.get("variant", c["task"]) != c["task"] else "")
        out.append(f"| {c['model']} | {task} | {c['split']} | {c['metric']} | {cell(setting)} | {number} |")
    return "\n".join(out) + "\n"


PAPERS = {
    "ndr": "NDR (Csordás et al.)",
    "panm": "PANM (Le et al.)",
    "compositional_attention": "Compositional Attention (Mittal et al.)",
}
PAGES = {
    "cli": cli_page,
    "search-space": search_space_page,
    "catalogue": catalogue_page,
    "published": published_page,
}
