"""The reproduction board: each claim of the papers (claims.yaml) with the best evidence that the
finished launches under a storage path hold for it, and its verdict (docs/guide/board.md).

A claim says that each model of `better` beats each of `than` on one column. A launch is evidence
for it where it has a row (a cell over seeds: an ablation's cell, a search's best candidate) of the
claim's task and options for a `better` model and for at least one `than` model; the statistics are
the reports' (cells.cell_rows: mean, Student-t interval, the paper's number and our seeds tested
against it; stats.two_sided_p between the sides, by the launch's own test). Each claim is decided on
its own at ALPHA, whatever launch or nightly file its evidence came from.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import platform
import socket
from pathlib import Path

import yaml

from ..record.files import write_atomically
from ..record.mlflow_ui import ui_address
from ..record.runs import ENDED, git_state, launch_trial_runs
from ..record.state import LaunchState, readable_launches
from ..record.stores import client
from . import stats
from .cells import cell_rows
from .frames import answer_runs, completed, lower_is_better, one_data, runs_frame, task_runs
from .pages import environment
from .papers import PAPER_NAMES, known_values, paper_value

CLAIMS = Path(__file__).with_name("claims.yaml")
CPU_CHECK_MINUTES = 15  # what a check of deploy/nightly-cpu.yaml may take on 2 cores; longer is said
LEARNED_WITHIN = 0.05  # a model learned its training distribution within this of the paper's IID score
# Every claim's level, for each of its comparisons and each model against the paper's number: not a
# launch's report.alpha, which a nightly file of k checks divides by k for its regressions.
ALPHA = 0.05
VERDICTS = (
    "reproduced",
    "ordering shown",
    "not shown at this scale",
    "not reproduced at the paper's scale",
    "contradicted",
    "not run",
)
CLAIM_KEYS = {"id", "paper", "table", "says", "column", "better", "than"}
COLUMN_KEYS = {"task", "options", "split", "score", "when"}


@dataclasses.dataclass(frozen=True)
class Side:
    """A model of a claim, and the settings that pick its row."""

    model: str
    setting: tuple = ()  # (key, value) pairs

    @property
    def label(self) -> str:
        return self.model + "".join(f", {k}={v}" for k, v in self.setting)

    def picks(self, model: str, known: dict) -> bool:
        return model == self.model and all(known.get(k) == v for k, v in self.setting)


@dataclasses.dataclass(frozen=True)
class Claim:
    id: str
    paper: str
    table: str
    says: str
    task: str
    options: tuple
    split: str
    score: str
    when: str  # at_best or final
    better: tuple[Side, ...]
    than: tuple[Side, ...]

    @property
    def metric(self) -> str:
        return f"{self.split}_{self.score}_{self.when}"

    def covers(self, task: str, known: dict) -> bool:
        return task == self.task and all(known.get(k) == v for k, v in self.options)


class ClaimError(ValueError):
    """claims.yaml holds what is no claim: the message names the claim and the key."""


def side(entry, where: str) -> Side:
    if isinstance(entry, str):
        return Side(entry)
    if not isinstance(entry, dict) or set(entry) - {"model", "setting"} or "model" not in entry:
        raise ClaimError(f"{where}: expected a model name or {{model, setting}}, got {entry!r}")
    return Side(entry["model"], tuple(sorted((entry.get("setting") or {}).items())))


def parse_claim(raw: dict, k: int) -> Claim:
    where = f"claims[{k}]"
    if not isinstance(raw, dict) or set(raw) != CLAIM_KEYS:
        raise ClaimError(f"{where}: expected the keys {', '.join(sorted(CLAIM_KEYS))}, got {raw!r}")
    where = f"claims[{k}] ({raw['id']})"
    column = raw["column"]
    if (
        not isinstance(column, dict)
        or set(column) - COLUMN_KEYS
        or not {"task", "split", "score"} <= set(column)
    ):
        raise ClaimError(f"{where}: column: expected task, split, score (options, when), got {column!r}")
    if column.get("when", "at_best") not in ("at_best", "final"):
        raise ClaimError(f"{where}: column.when: expected at_best or final, got {column['when']!r}")
    return Claim(
        id=raw["id"],
        paper=raw["paper"],
        table=str(raw["table"]),
        says=raw["says"],
        task=column["task"],
        options=tuple(sorted((column.get("options") or {}).items())),
        split=column["split"],
        score=column["score"],
        when=column.get("when", "at_best"),
        better=tuple(side(e, f"{where}: better") for e in raw["better"]),
        than=tuple(side(e, f"{where}: than") for e in raw["than"]),
    )


def load_claims(path: Path = CLAIMS) -> list[Claim]:
    claims = [parse_claim(raw, k) for k, raw in enumerate(yaml.safe_load(path.read_text()) or [])]
    ids = [c.id for c in claims]
    doubled = sorted({i for i in ids if ids.count(i) > 1})
    if doubled:
        raise ClaimError(f"{path.name}: claim ids used twice: {', '.join(doubled)}")
    return claims


@dataclasses.dataclass(frozen=True)
class Launch:
    """What the board shows of a launch: its id, when it ran, how long, and where to look closer."""

    launch_id: str
    started: float  # seconds since the epoch
    minutes: float | None
    report: Path
    mlflow_link: str
    test: str  # the launch's test across seeds (report.test)
    spec_file: str = ""
    code_version: str = "unknown"  # the parent run's tag (record.runs.code_tags)
    host: str = ""  # the driver's

    @property
    def ended(self) -> float:
        return self.started + 60 * (self.minutes or 0.0)


@dataclasses.dataclass(frozen=True)
class Row:
    """One model's row of a launch on a claim's column: its seeds' values and what stands beside them."""

    launch: Launch
    model: str
    known: dict
    summary: stats.Summary
    values: tuple
    published: dict | None
    vs_paper: float | None
    steps: int | None
    paper_steps: int | None
    paper_scale: bool
    iid: stats.Summary | None
    learned: bool | None
    label: str = ""  # the claim's side it stands for (NDR with 14 layers)

    @property
    def share(self) -> float | None:
        """The share of the paper's training steps this row ran."""
        return self.steps / self.paper_steps if self.steps and self.paper_steps else None


@dataclasses.dataclass(frozen=True)
class Evidence:
    """One launch's rows for a claim, and each better-than-other comparison they allow: (the better
    side's row, the other's, p of their difference or None under two seeds, right: in the claimed order)."""

    launch: Launch
    rows: tuple[Row, ...]
    comparisons: tuple[tuple[Row, Row, float | None, bool], ...]

    def rank(self) -> tuple:
        """Best evidence first: at the paper's scale, more comparisons, a larger share of the paper's
        steps, more seeds, newer."""
        return (
            all(r.paper_scale for r in self.rows),
            len(self.comparisons),
            min(r.share or 0.0 for r in self.rows),
            min(r.summary.n for r in self.rows),
            self.launch.started,
        )


def launch_info(state: LaunchState, mlflow, study, ui_url: str | None) -> Launch:
    parent = mlflow.get_run(state.parent_run_id)
    start, end = parent.info.start_time, parent.info.end_time
    ui = ui_address(state.tracking_uri, ui_url, state.dir)["url"]
    return Launch(
        launch_id=state.launch_id,
        started=start / 1000,
        minutes=(end - start) / 60_000 if end else None,
        report=state.dir / "report" / "report.html",
        mlflow_link=f"{ui}/#/experiments/{parent.info.experiment_id}/runs/{state.parent_run_id}",
        test=study.report.test,
        spec_file=state.spec_file,
        code_version=parent.data.tags.get("code_version", "unknown"),
        host=parent.data.tags.get("driver_host", ""),
    )


def learned(iid: dict | None, low: bool) -> bool | None:
    """Whether a row's training-distribution score is within LEARNED_WITHIN of the paper's (or of a
    perfect accuracy where the paper prints none); None where that cannot be said (an L1 alone)."""
    if iid is None:
        return None
    reference = iid["published"]["mean"] if iid["published"] else (None if low else 1.0)
    if reference is None:
        return None
    mean = iid["summary"].mean
    return mean <= reference + LEARNED_WITHIN if low else mean >= reference - LEARNED_WITHIN


def make_row(launch: Launch, claim: Claim, model: str, row: dict, known: dict) -> Row:
    """A report row (cells.cell_rows) as the board reads it for `claim`."""
    entry, config = row["metrics"][claim.metric], row["config"]
    cell = entry["published"]
    iids = [row["metrics"][m] for m in iid_metrics(claim) if m in row["metrics"]]
    iid = next((e for e in iids if e["published"]), iids[0] if iids else None)
    steps = config.get("n_iters")
    paper_steps = paper_value(cell, model, claim.task, config, "n_iters")
    paper_width = dict((cell or {}).get("setting") or {}).get("d_model") or paper_value(
        None, model, claim.task, config, "d_model"
    )
    same_width = None in (paper_width, known.get("d_model")) or paper_width == known.get("d_model")
    return Row(
        launch=launch,
        model=model,
        known=known,
        summary=entry["summary"],
        values=tuple(entry["values"]),
        published=cell,
        vs_paper=entry.get("vs_paper"),
        steps=steps,
        paper_steps=paper_steps,
        paper_scale=bool(steps and paper_steps and steps >= paper_steps and same_width),
        iid=iid and iid["summary"],
        learned=learned(iid, lower_is_better(claim.metric)),
    )


def iid_metrics(claim: Claim) -> tuple[str, str]:
    """The training-distribution scores beside a claim's: the paper's IID columns are of the last model."""
    return f"iid_valid_{claim.score}_final", f"iid_valid_{claim.score}_at_best"


def launch_rows(state: LaunchState, claims: list[Claim], ui_url: str | None) -> list[tuple[Claim, Row]]:
    """(claim, row) for each row of a finished launch on a claim's column, by the report's statistics."""
    study = state.study()
    frame = completed(runs_frame(state, launch_trial_runs(state.tracked), ENDED))
    if not len(frame):
        return []
    launch = launch_info(state, client(state.tracking_uri), study, ui_url)
    out = []
    for pair in study.pairs:
        task = pair.task.task
        wanted = [
            c for c in claims if c.task == task and any(s.model == pair.model for s in c.better + c.than)
        ]
        runs, _ = one_data(frame[frame["pair"] == pair.name], task_runs(frame, pair))
        runs, keys = answer_runs(runs, study, pair)
        metrics = sorted({m for c in wanted for m in (c.metric, *iid_metrics(c)) if m in runs.columns})
        if not wanted or not len(runs) or not metrics:
            continue
        for row in cell_rows(runs, keys, metrics, study.report, {}, study.score, pair.chosen):
            known = known_values(task, row["config"], pair.model)
            out += [
                (claim, make_row(launch, claim, pair.model, row, known))
                for claim in wanted
                if claim.covers(task, known) and claim.metric in row["metrics"]
            ]
    return out


def best_row(rows: list[Row], side: Side, low: bool) -> Row | None:
    """The side's row of one launch: its best where a grid or a search's candidates give several."""
    picked = [r for r in rows if side.picks(r.model, r.known)]
    best = min(picked, key=lambda r: r.summary.mean if low else -r.summary.mean, default=None)
    return best and dataclasses.replace(best, label=side.label)


def evidence(claim: Claim, rows: list[Row]) -> Evidence | None:
    """One launch's evidence for `claim`, or None where it lacks a better side or every other side."""
    low = lower_is_better(claim.metric)
    better = [r for r in (best_row(rows, s, low) for s in claim.better) if r]
    than = [r for r in (best_row(rows, s, low) for s in claim.than) if r]
    if not better or not than:
        return None
    launch = better[0].launch
    comparisons = []
    for b in better:
        for t in than:
            several = len(b.values) > 1 and len(t.values) > 1
            p = stats.two_sided_p(b.values, t.values, launch.test) if several else None
            right = b.summary.mean < t.summary.mean if low else b.summary.mean > t.summary.mean
            comparisons.append((b, t, p, right))
    return Evidence(launch, tuple({id(r): r for r in better + than}.values()), tuple(comparisons))


def not_significant(e: Evidence) -> str:
    """The comparisons of `e` not shown in the claimed order at p < ALPHA, each with its p."""
    out = []
    for b, t, p, right in e.comparisons:
        if not (right and p is not None and p < ALPHA):
            tested = "under two seeds a side, untested" if p is None else f"p = {p:.3g}"
            order = "" if right else ", tied" if b.summary.mean == t.summary.mean else ", reversed"
            out.append(f"{b.label} against {t.label}, {tested}{order}")
    return "; ".join(out)


def decide(e: Evidence | None) -> tuple[str, str]:
    """(verdict, why) from the best evidence, by the reports' statistics at the board's ALPHA."""
    if e is None:
        return "not run", "no finished launch ran the claim's models on its column"
    shown = [p is not None and p < ALPHA and right for _, _, p, right in e.comparisons]
    reversed_ = [p is not None and p < ALPHA and not right for _, _, p, right in e.comparisons]
    if all(r.paper_scale for r in e.rows):
        off = [r for r in e.rows if r.vs_paper is not None and r.vs_paper < ALPHA]
        if off or any(reversed_):
            what = (
                f"{', '.join(r.model for r in off)} unlike the paper's number"
                if off
                else "the order reversed"
            )
            return "contradicted", f"at the paper's scale, {what} (p < {ALPHA:g})"
        printed = all(b.vs_paper is not None and t.vs_paper is not None for b, t, _, _ in e.comparisons)
        if all(right for *_, right in e.comparisons) and (printed or all(shown)):
            return "reproduced", "at the paper's scale, within the published numbers and in the claimed order"
        why = f"at the paper's scale, the claimed order not significant at {ALPHA:g}: {not_significant(e)}"
        return "not reproduced at the paper's scale", why
    if all(shown):
        return "ordering shown", f"in the claimed order, p < {ALPHA:g} for every pair, at a smaller scale"
    shares = [r.share for r in e.rows if r.share is not None]
    ran = f"{min(shares):.0%} of the paper's steps" if shares else "the paper's steps unknown"
    few = "; under two seeds a side, no test" if any(p is None for _, _, p, _ in e.comparisons) else ""
    return "not shown at this scale", f"{ran}{few}"


def finished_launches(storage_path: Path, tracking_uri: str | None) -> list[LaunchState]:
    """The finished launches under `storage_path` (of the store `tracking_uri` only, where given)."""
    return [
        s
        for s in readable_launches(storage_path)
        if s.state == "finished" and (tracking_uri is None or s.tracking_uri == tracking_uri)
    ]


def claim_entry(claim: Claim, found: list[Evidence], board_dir: Path) -> dict:
    """A claim's line of the board: its verdict from its best evidence, and every launch that has any."""
    best = max(found, key=Evidence.rank, default=None)
    verdict, why = decide(best)
    slow = best and best.launch.minutes and best.launch.minutes > CPU_CHECK_MINUTES
    return {
        "claim": claim,
        "verdict": verdict,
        "why": why,
        "best": best,
        "report": best and os.path.relpath(best.launch.report, board_dir),
        "slow": bool(slow) and not all(r.paper_scale for r in best.rows),
        "launches": sorted({e.launch.launch_id for e in found}),
    }


def build(
    storage_path: Path, launches: list[LaunchState], board_dir: Path, ui_url: str | None = None
) -> dict:
    """Everything the board's templates show: per paper, each claim with its verdict and evidence."""
    claims = load_claims()
    found: dict[str, dict[str, list[Row]]] = {}
    for state in launches:
        for claim, row in launch_rows(state, claims, ui_url):
            found.setdefault(claim.id, {}).setdefault(state.launch_id, []).append(row)
    entries = []
    for claim in claims:
        per_launch = [evidence(claim, rows) for rows in found.get(claim.id, {}).values()]
        entries.append(claim_entry(claim, [e for e in per_launch if e], board_dir))
    return {
        "storage_path": str(storage_path),
        "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
        "launches": len(launches),
        "counts": {v: sum(e["verdict"] == v for e in entries) for v in VERDICTS},
        "papers": [
            {"name": PAPER_NAMES[paper], "claims": [e for e in entries if e["claim"].paper == paper]}
            for paper in dict.fromkeys(c.paper for c in claims)
        ],
        "minutes": CPU_CHECK_MINUTES,
        "alpha": ALPHA,
    }


def counts(context: dict) -> str:
    """The board's verdicts counted, in a line."""
    return ", ".join(f"{n} {verdict}" for verdict, n in context["counts"].items())


# The generated part of a docs page: a page's own text stays outside them (write_docs).
BEGIN_TAG = "<!-- board:begin"
DOCS_BEGIN = f"{BEGIN_TAG}: written by `orchestrator board --docs`; edit outside board:begin/board:end -->"
DOCS_END = "<!-- board:end -->"


def render(context: dict, links: bool = True) -> tuple[str, str]:
    """-> (Markdown, HTML) from the templates; without `links`, the Markdown names the launches
    without linking them (the docs' copy, where the launches' folders are not)."""
    env = environment()
    return (
        env.get_template("board.md.j2").render(**context, links=links),
        env.get_template("board.html.j2").render(**context, links=True),
    )


def cpu() -> str:
    """This machine's CPU model and cores, and its system, as a results page states them."""
    model = platform.processor() or "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:  # Linux names the model here; platform.processor() does not
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        model = names[0] if names else model
    except OSError:
        pass
    return f"{model}, {os.cpu_count() or 1} cores, {platform.system()} {platform.machine()}"


def docs_problem(path: Path) -> str | None:
    """Why `path` cannot take the board (a page of its own without both markers), else None."""
    if not path.exists():
        return None
    text = path.read_text()
    if BEGIN_TAG not in text or DOCS_END not in text:
        return f"holds no {BEGIN_TAG} ... --> and {DOCS_END} markers, between which the board is written"
    return None


def docs_page(old: str | None, block: str) -> str:
    """`old` with its part between the markers replaced by `block`; a new page where there is none."""
    if old is None:
        return f"# The reproduction board\n\n{block}\n"
    head = old[: old.index(BEGIN_TAG)]
    tail = old[old.index(DOCS_END) + len(DOCS_END) :]
    return head + block + tail


def write_docs(path: Path, launches: list[LaunchState], context: dict, command: str) -> Path:
    """The board as a docs page's generated part (docs/results.md): the facts of what ran, where,
    at which code and when, then the board's tables; the page's text outside the markers stays."""
    ran = sorted(
        (launch_info(s, client(s.tracking_uri), s.study(), None) for s in launches), key=lambda x: x.started
    )
    sha, dirty = git_state()
    block = (
        environment()
        .get_template("board_docs.md.j2")
        .render(
            **context,
            links=False,
            begin=DOCS_BEGIN,
            command=command,
            machine=cpu(),
            elsewhere=sum(x.host != socket.gethostname() for x in ran),
            commit=sha[:7] + ("-dirty" if dirty else "") if sha else "unknown",
            ran=ran,
        )
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    block = f"{block.rstrip()}\n\n{DOCS_END}"
    write_atomically(path, docs_page(path.read_text() if path.exists() else None, block))
    return path


def log_board(tracking_uri: str, paths: list[Path], counts: dict) -> None:
    """The board's files and its verdict counts as a run of the experiment `board` in `tracking_uri`."""
    mlflow = client(tracking_uri)
    experiment = mlflow.get_experiment_by_name("board")
    experiment_id = experiment.experiment_id if experiment else mlflow.create_experiment("board")
    run = mlflow.create_run(experiment_id, run_name=f"board {datetime.datetime.now():%Y-%m-%d %H:%M}")
    for verdict, n in counts.items():
        name = "claims " + verdict.replace("'", "")  # MLflow's metric names allow no apostrophe
        mlflow.log_metric(run.info.run_id, name, n)
    for path in paths:
        mlflow.log_artifact(run.info.run_id, str(path))
    mlflow.set_terminated(run.info.run_id)


def write(
    storage_path: Path,
    tracking_uri: str | None = None,
    ui_url: str | None = None,
    out: Path | None = None,
    links: bool = True,
    docs: tuple[Path, str] | None = None,
) -> tuple[list[Path], dict]:
    """The board as board.md and board.html under `out` (default <storage_path>/board), logged to
    MLflow in `tracking_uri` (default: the store of the newest finished launch), and where `docs`
    (a page, the command that writes it) is given, into that page (write_docs); -> (files, counts)."""
    out = out or storage_path / "board"
    out.mkdir(parents=True, exist_ok=True)
    launches = finished_launches(storage_path, tracking_uri)
    context = build(storage_path, launches, out, ui_url)
    markdown, page = render(context, links)
    paths = [out / "board.md", out / "board.html"]
    write_atomically(paths[0], markdown)
    write_atomically(paths[1], page)
    store = tracking_uri or (max(launches, key=lambda s: s.created or 0).tracking_uri if launches else None)
    if store:
        log_board(store, paths, context["counts"])
    if docs:
        paths.append(write_docs(docs[0], launches, context, docs[1]))
    return paths, context
