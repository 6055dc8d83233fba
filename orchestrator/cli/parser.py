"""The command line: each command's help and options in one table (COMMANDS), and the function
that runs it, named there and imported only once the command is chosen."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib
import importlib.metadata
import os
from collections.abc import Callable

from ..record.mlflow_ui import DEFAULT_URL
from .inputs import port_number, ui_url

DESCRIPTION = (
    "`orchestrator train | launch | nightly | resume | status | best | report | export | dashboard | ui | "
    "accept | board | list`: one entry point for the service."
)

ADDRESS = {
    "default": os.environ.get("RAY_ADDRESS"),
    "help": "join this Ray cluster, HOST:PORT or auto (default: $RAY_ADDRESS, else start a new local "
    "instance)",
}


class OneLineParser(argparse.ArgumentParser):
    """Bad arguments get one line and exit status 2, as bad files do (argparse prints its usage first)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (`{self.prog} --help` says more)\n")


def train_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("source", help="a YAML trial config, or a preset such as ctl/ndr")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a key (repeatable)")


def launch_options(p: argparse.ArgumentParser, what: str) -> None:
    """`launch` and `nightly`: the same options, for a launch of one file or a night of several."""
    p.add_argument("file", help=what)
    p.add_argument("--address", **ADDRESS)
    p.add_argument("--tracking-uri", help="override the file's tracking.uri")
    p.add_argument(
        "--storage",
        help="override the file's storage: where trial checkpoints live (a folder every node sees, "
        "or s3://bucket/prefix)",
    )
    p.add_argument(
        "--launch-id", help="name the launch (default: <name>-<timestamp>, or <name>-night-<timestamp>)"
    )
    p.add_argument(
        "--dry-run", action="store_true", help="validate and print the plan and its cost; launch nothing"
    )
    p.add_argument(
        "--calibrate",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="with --dry-run: time a few training steps of each pair here (or on the cluster's nodes) "
        "instead of pricing them, in seconds, by the step rates of earlier trials in the tracking "
        "store, else the benchmarks' rates scaled to each pair's size (the default, --no-calibrate)",
    )


def list_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("what", choices=["tasks", "models", "presets", "launches"])
    p.add_argument("--storage-path", default="runs", help="where launches live (default: runs)")


def a_launch(p: argparse.ArgumentParser) -> None:
    """The commands on a launch already made: each names one (by id or folder), or takes the last."""
    p.add_argument("launch", nargs="?", help="launch id or folder (default: the one started last)")
    p.add_argument("--storage-path", default="runs", help="where launches live (default: runs)")


def resume_options(p: argparse.ArgumentParser) -> None:
    a_launch(p)
    p.add_argument("--address", **ADDRESS)


def best_options(p: argparse.ArgumentParser) -> None:
    a_launch(p)
    p.add_argument(
        "--ablation",
        help="an ablation file: also write it with each pair's winning values (per_pair) to "
        "<launch>/best/<its stem>_tuned.yaml",
    )


def report_options(p: argparse.ArgumentParser) -> None:
    a_launch(p)
    p.add_argument(
        "--compare",
        help="another launch (id or folder), or 'previous' for the last finished launch of the same file",
    )
    p.add_argument(
        "--mlflow-url",
        type=ui_url,
        help=f"where the links find MLflow's UI (`orchestrator ui` prints it; default: {DEFAULT_URL}, "
        "or the tracking server)",
    )


def export_options(p: argparse.ArgumentParser) -> None:
    a_launch(p)
    # Checked by cmd_export, not by argparse's choices: bad input is one line, exit status 2.
    p.add_argument("--format", help="csv or parquet (default: --output's extension, else csv)")
    p.add_argument("--output", help="the file to write (default: <launch>/export/runs.<format>)")


def dashboard_options(p: argparse.ArgumentParser) -> None:
    a_launch(p)
    p.add_argument("--port", type=port_number, default=8080, help="default: 8080")
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="the address to listen on (default: 127.0.0.1, this machine only)",
    )


def ui_options(p: argparse.ArgumentParser) -> None:
    a_launch(p)
    p.add_argument(
        "--port",
        type=port_number,
        help="on 127.0.0.1 (default: 5000 where free, else a free one; 0: a free one)",
    )


def board_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--storage-path", default="runs", help="where launches live (default: runs)")
    p.add_argument(
        "--tracking-uri",
        help="only the launches tracked in this store, where the board is logged too (default: every "
        "launch; logged in the newest launch's store)",
    )
    p.add_argument("--output", help="the folder to write (default: <storage-path>/board)")
    p.add_argument(
        "--no-links",
        action="store_true",
        help="the Markdown names each launch without linking its report and runs: for a page kept elsewhere",
    )
    p.add_argument(
        "--docs",
        metavar="PAGE",
        help="also write the board, without links, after a table of facts (machine, commits, dates, "
        "launches) between the page's board:begin and board:end markers (docs/results.md); a new "
        "page where PAGE does not exist",
    )
    p.add_argument(
        "--mlflow-url",
        type=ui_url,
        help=f"where the links find MLflow's UI (default: {DEFAULT_URL}, or the tracking server)",
    )


@dataclasses.dataclass(frozen=True)
class Command:
    """A command: its one-line help, its options, and the function that runs it, as
    "module:function" under orchestrator.cli; `runs_trials` where it drives trials for hours, its
    console outliving a reader that goes (process.OutlivesItsReader)."""

    name: str
    help: str
    options: Callable[[argparse.ArgumentParser], None]
    run: str
    runs_trials: bool = False


COMMANDS = (
    Command(
        "train",
        "train one trial from a preset (task/model) or a YAML trial config",
        train_options,
        "train:cmd_train",
    ),
    Command(
        "launch",
        "search every model/task pair of a search-space file (or run an ablation file) on Ray Tune",
        functools.partial(
            launch_options, what="a search-space or ablation YAML, e.g. search_spaces/ctl.yaml"
        ),
        "launch:cmd_launch",
        runs_trials=True,
    ),
    Command(
        "nightly",
        "run an ablation file (or each ablation a nightly file lists) as tonight's night: new seeds, "
        "a report compared by a test across seeds with the last finished night that flagged no "
        "regression (or whose regression was accepted), dated beside the previous nights' (exit 1 on "
        "a regression)",
        functools.partial(
            launch_options,
            what="an ablation YAML, or a nightly file (deploy/nightly.yaml: ablations and a budget), "
            "e.g. ablations/ndr_cpu_ctl.yaml",
        ),
        "launch:cmd_nightly",
        runs_trials=True,
    ),
    Command(
        "list",
        "the tasks, models and presets one can name, or the launches under --storage-path",
        list_options,
        "catalog:cmd_list",
    ),
    Command(
        "resume",
        "continue a launch whose driver stopped",
        resume_options,
        "launch:cmd_resume",
        runs_trials=True,
    ),
    Command(
        "status",
        "whether the driver is alive; per pair trials done / stopped early / running (unfinished once "
        "the driver is gone) / failed and the best so far (an ablation's per grid cell)",
        a_launch,
        "readers:cmd_status",
    ),
    Command(
        "best",
        "write the best config per pair as files `orchestrator train` accepts",
        best_options,
        "readers:cmd_best",
    ),
    Command(
        "report",
        "a launch's report: a search's per pair (best trial, trials, curves, importances, confirmed "
        "candidates), an ablation's per cell statistics over seeds, beside the papers' numbers, plots, "
        "attention maps (exit 1 on a regression vs --compare)",
        report_options,
        "report:cmd_report",
    ),
    Command(
        "export",
        "a launch's trial runs as one table (CSV or Parquet): tags, config and last metrics, a row per run",
        export_options,
        "export:cmd_export",
    ),
    Command(
        "dashboard",
        "optuna-dashboard on a search launch's Optuna studies (pip install -e '.[dashboard]')",
        dashboard_options,
        "dashboard:cmd_dashboard",
    ),
    Command(
        "ui",
        "MLflow's UI on the launch's store (one worker, port 5000 where free), and links to its trials "
        "best first, with the metric and the searched values as columns",
        ui_options,
        "ui:cmd_ui",
    ),
    Command(
        "accept",
        "a night that regressed on purpose: the nights after it compare with it, not with the last "
        "night before it",
        a_launch,
        "readers:cmd_accept",
    ),
    Command(
        "board",
        "the reproduction board: each claim of the three papers with the best evidence of every finished "
        "launch under --storage-path and a verdict (reproduced, ordering shown, not shown at this scale, "
        "not reproduced at the paper's scale, contradicted, not run), as Markdown and HTML, logged to MLflow",
        board_options,
        "board:cmd_board",
    ),
)


def parser_and_commands() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The parser, and each command's own (the reference page's source: orchestrator.reference)."""
    parser = OneLineParser(prog="orchestrator", description=DESCRIPTION)
    parser.add_argument(
        "--version",
        action="version",
        version=f"%(prog)s {importlib.metadata.version('sysgen-search')}",
        help="the installed package's version (pyproject.toml's; docs/changelog.md says what each brought)",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        p = sub.add_parser(command.name, help=command.help, description=command.help)
        command.options(p)
        p.set_defaults(run=command.run)
    return parser, dict(sub.choices)


def runs_trials(argv: list[str]) -> bool:
    """Whether `argv`, the words after `orchestrator`, name a command that drives trials."""
    return any(command.runs_trials and argv[:1] == [command.name] for command in COMMANDS)


def build_parser() -> argparse.ArgumentParser:
    return parser_and_commands()[0]


def chosen(args: argparse.Namespace) -> Callable[[argparse.Namespace], int]:
    """The function of the command `args` chose. Its module is imported here, once the command is
    known: torch, Ray and pandas take seconds to import, and `status` or `--help` need none of them."""
    module, function = args.run.split(":")
    return getattr(importlib.import_module(f".{module}", __package__), function)
