"""The reproduction board over launches of known outcome planted in a real MLflow store (SQLite), as
the tracker writes them: each verdict, the evidence it rests on, and every published table with a
claim."""

import json
import socket
import uuid
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from orchestrator.cli.process import main
from orchestrator.plan.nightly import nightly_files
from orchestrator.record import runs, stores
from orchestrator.record.runs import artifact_root
from orchestrator.record.state import LaunchState
from orchestrator.report import board, papers, stats
from trainables.models import MODELS
from trainables.tasks import TASKS

CTL = {"task": "ctl", "variant": "ctl_backward", "options": {"direction": "backward"}}
PAPER_CTL = {"ndr": [1.0, 1.0, 1.0], "transformer": [0.12, 0.13, 0.11]}  # NDR Table 1, backward


def plant(tmp_path, uri: str, launch_id: str, spec: dict, scores: dict, iid: float = 1.0) -> LaunchState:
    """A finished launch of `spec` in the store: scores[model] -> each seed's test score (an
    ablation's seeds, or a search's one best trial), each run's config its pair's as the launch
    gives it. The spec's metric names the score; the IID score is `iid` for every run."""
    text = yaml.safe_dump({"name": spec["name"], "tracking": {"uri": uri}, **spec})
    folder = tmp_path / "runs" / launch_id
    folder.mkdir(parents=True)
    state = LaunchState(
        launch_id, folder, spec["name"], f"{spec['name']}.yaml", text, uri, "", state="finished"
    )
    study = state.study()
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(spec["name"])
    exp_id = (
        exp.experiment_id if exp else client.create_experiment(spec["name"], artifact_root(uri, tmp_path))
    )
    host = socket.gethostname()
    tags = {"launch_id": launch_id, "kind": "launch", "code_version": "abc", "driver_host": host}
    parent = client.create_run(exp_id, tags=tags)
    score = study.score
    for pair in study.pairs:
        pair_run = runs.pair_run(stores.client(uri), exp_id, parent.info.run_id, launch_id, pair.name)
        for seed, value in enumerate(scores[pair.model]):
            config = {**pair.base, "seed": seed}
            tags = {"launch_id": launch_id, "kind": "trial", "pair": pair.name, "model": pair.model}
            run = client.create_run(
                exp_id,
                tags={
                    **tags,
                    "mlflow.parentRunId": pair_run,
                    "task": pair.task.task,
                    "variant": pair.task.variant,
                    "trial_id": uuid.uuid4().hex[:8],
                    "phase": "search",
                    "trial_status": "completed",
                    "trial_config": json.dumps(config),
                },
            )
            for split in ("test", "test_x2"):
                client.log_metric(run.info.run_id, f"{split}_{score}_at_best", value, step=10)
            client.log_metric(run.info.run_id, f"best_ood_valid_{score}", value, step=10)
            client.log_metric(run.info.run_id, f"iid_valid_{score}_final", iid, step=10)
            client.set_terminated(run.info.run_id)
    client.set_terminated(parent.info.run_id)
    state.parent_run_id = parent.info.run_id
    state.save()
    return state


def ctl_ablation(n_iters: int | None = None) -> dict:
    """NDR against the Transformer on CTL backward over three seeds; without n_iters, each at its
    preset's steps and width, as the paper trains them."""
    return {
        "name": "ctl_test",
        "tasks": [CTL],
        "models": ["ndr", "transformer"],
        "metric": "best_ood_valid_acc",
        "seeds": [0, 1, 2],
        **({"budget": {"n_iters": n_iters}} if n_iters else {}),
    }


COPY_SEARCH = {
    "name": "copy_test",
    "tasks": [{"task": "copy", "options": {"eval_size": 16}}],
    "models": ["panm", "lstm_seq2seq"],
    "metric": "best_ood_valid_token_acc",
    "budget": {"trials": 1, "n_iters": 500},
    "space": {"lr": {"loguniform": [1e-3, 1e-2]}},
}


def verdicts(tmp_path) -> dict[str, tuple[str, str]]:
    """Each claim's (verdict, its evidence's launch) on the board of tmp_path/runs, as `board` writes it."""
    assert main(["board", "--storage-path", str(tmp_path / "runs")]) == 0
    context = board.build(
        tmp_path / "runs", board.finished_launches(tmp_path / "runs", None), tmp_path / "runs" / "board"
    )
    return {
        e["claim"].id: (e["verdict"], e["best"] and e["best"].launch.launch_id)
        for paper in context["papers"]
        for e in paper["claims"]
    }


@pytest.fixture()
def uri(tmp_path):
    return f"sqlite:///{tmp_path}/mlflow.db"


def test_the_board_gives_each_claim_its_verdict_from_its_best_evidence(tmp_path, uri):
    """A tiny CTL ablation (20 steps) where NDR beats the Transformer far beyond noise shows the
    order, never a reproduction; a search's single seeds cannot show one; what no launch ran is
    'not run'. A launch at the paper's steps and width within the paper's numbers reproduces the
    claim and is preferred; a newer one at that scale that reverses the order contradicts it."""
    plant(tmp_path, uri, "ctl-tiny", ctl_ablation(n_iters=20), PAPER_CTL)
    plant(tmp_path, uri, "copy-search", COPY_SEARCH, {"panm": [0.9], "lstm_seq2seq": [0.1]})
    found = verdicts(tmp_path)
    assert found["ndr-t1-ctl"] == ("ordering shown", "ctl-tiny")
    assert found["panm-t7-copy"] == ("not shown at this scale", "copy-search")
    assert found["ca-t6-retrieval"] == ("not run", None) and found["ndr-t4-depth"] == ("not run", None)
    assert {v for v, _ in found.values()} == {"ordering shown", "not shown at this scale", "not run"}
    markdown = (tmp_path / "runs" / "board" / "board.md").read_text()
    assert "20 of 30,000" in markdown and "[ctl-tiny](../ctl-tiny/report/report.html)" in markdown

    plant(tmp_path, uri, "ctl-paper", ctl_ablation(), PAPER_CTL)
    assert verdicts(tmp_path)["ndr-t1-ctl"] == ("reproduced", "ctl-paper")
    plant(
        tmp_path,
        uri,
        "ctl-reversed",
        ctl_ablation(),
        {"ndr": [0.1, 0.12, 0.11], "transformer": [0.9, 0.92, 0.91]},
    )
    assert verdicts(tmp_path)["ndr-t1-ctl"] == ("contradicted", "ctl-reversed")


def test_the_board_is_logged_to_mlflow_and_its_page_links_each_launch(tmp_path, uri):
    plant(tmp_path, uri, "ctl-tiny", ctl_ablation(n_iters=20), PAPER_CTL)
    assert (
        main(["board", "--storage-path", str(tmp_path / "runs"), "--mlflow-url", "http://127.0.0.1:5055"])
        == 0
    )
    page = (tmp_path / "runs" / "board" / "board.html").read_text()
    assert '<a href="../ctl-tiny/report/report.html">ctl-tiny</a>' in page
    assert "http://127.0.0.1:5055/#/experiments/" in page
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("board").experiment_id])
    assert run.data.metrics["claims ordering shown"] == 1
    assert {a.path for a in client.list_artifacts(run.info.run_id)} == {"board.md", "board.html"}
    docs = tmp_path / "docs"
    assert main(["board", "--storage-path", str(tmp_path / "runs"), "--output", str(docs), "--no-links"]) == 0
    markdown = (docs / "board.md").read_text()
    assert "`ctl-tiny`" in markdown and "report.html" not in markdown and "](http" not in markdown


def test_board_docs_writes_a_page_of_facts_and_the_board_between_its_markers_alike_each_time(tmp_path, uri):
    """`board --docs PAGE` writes, between the page's markers, the facts (this machine, the board's
    commit, the launches' dates, each launch with its file and commit), the command that rewrites it,
    and the board's tables; the page's own text outside stays, and a rerun writes the same page."""
    plant(tmp_path, uri, "ctl-tiny", ctl_ablation(n_iters=20), PAPER_CTL)
    page = tmp_path / "docs" / "results.md"
    page.parent.mkdir()
    own = "# Results\n\nBefore.\n\n", "\n\n## Notes\n\nAfter.\n"
    page.write_text(f"{own[0]}{board.DOCS_BEGIN}\nold\n{board.DOCS_END}{own[1]}")
    argv = ["board", "--storage-path", str(tmp_path / "runs"), "--docs", str(page)]
    assert main(argv) == 0
    text = page.read_text()
    assert text.startswith(f"{own[0]}{board.DOCS_BEGIN}\n") and "old" not in text
    assert text.endswith(f"\n\n{board.DOCS_END}{own[1]}")
    assert f"Regenerate with: `orchestrator board --storage-path {tmp_path / 'runs'} --docs {page}`" in text
    assert f"| machine | {board.cpu()}: where this page was written; every launch below ran on it |" in text
    assert "| launches | 1 finished under" in text and "| verdicts | 0 reproduced, 1 ordering shown, " in text
    assert "| `ctl-tiny` | `ctl_test.yaml` |" in text and "| `abc` |" in text
    assert "| **Table 1** (ndr-t1-ctl):" in text and "`ctl-tiny`, " in text and "report.html" not in text
    assert main(argv) == 0 and page.read_text() == text

    page.write_text("# A page of one's own\n")
    assert main(argv) == 2 and page.read_text() == "# A page of one's own\n"
    fresh = tmp_path / "new" / "board.md"
    assert main([*argv[:-1], str(fresh)]) == 0
    assert fresh.read_text().startswith(f"# The reproduction board\n\n{board.DOCS_BEGIN}\n")


def evidence_of(rows: dict, paper_scale: bool = False) -> board.Evidence:
    """Evidence of one launch with a better side `ndr` against `transformer`: rows[model] -> (seeds'
    values, p of our seeds against the paper's number or None)."""
    launch = board.Launch("l", 0.0, 1.0, Path("report.html"), "", "welch")
    made = {
        model: board.Row(
            launch=launch,
            model=model,
            known={},
            summary=stats.summarize(values),
            values=tuple(values),
            published=None,
            vs_paper=vs_paper,
            steps=10,
            paper_steps=10 if paper_scale else 100,
            paper_scale=paper_scale,
            iid=None,
            learned=None,
            label=model,
        )
        for model, (values, vs_paper) in rows.items()
    }
    p = stats.two_sided_p(made["ndr"].values, made["transformer"].values)
    right = made["ndr"].summary.mean > made["transformer"].summary.mean
    return board.Evidence(launch, tuple(made.values()), ((made["ndr"], made["transformer"], p, right),))


def test_a_run_tagged_as_a_trial_that_no_tracker_wrote_is_left_out_of_the_report_and_the_board(tmp_path, uri):
    """A run in the launch's experiment with its id and kind but none of the tags the tracker writes
    (a hand-logged or scripted one): the report and the board read the launch without it."""
    plant(tmp_path, uri, "l1", ctl_ablation(), {"ndr": [1.0, 1.0, 1.0], "transformer": [0.1, 0.1, 0.1]})
    client = MlflowClient(uri)
    exp_id = client.get_experiment_by_name("ctl_test").experiment_id
    run = client.create_run(exp_id, tags={"launch_id": "l1", "kind": "trial", "trial_status": "completed"})
    client.log_metric(run.info.run_id, "best_ood_valid_acc", 0.5, step=10)
    assert main(["report", str(tmp_path / "runs" / "l1")]) == 0
    assert main(["board", "--storage-path", str(tmp_path / "runs")]) == 0


def test_a_verdict_follows_the_scale_the_order_and_the_papers_numbers():
    strong = {"ndr": ([1.0, 0.99, 1.0], 0.9), "transformer": ([0.1, 0.12, 0.11], 0.8)}
    assert board.decide(evidence_of(strong))[0] == "ordering shown"
    assert board.decide(evidence_of(strong, paper_scale=True))[0] == "reproduced"
    off_paper = {**strong, "transformer": ([0.1, 0.12, 0.11], 0.001)}
    assert board.decide(evidence_of(off_paper, paper_scale=True))[0] == "contradicted"
    assert (
        board.decide(evidence_of(off_paper))[0] == "ordering shown"
    )  # a smaller scale says nothing of the paper's numbers
    noise = {"ndr": ([0.5, 0.3, 0.7], None), "transformer": ([0.4, 0.6, 0.45], None)}
    verdict, why = board.decide(evidence_of(noise))
    assert verdict == "not shown at this scale" and why == "10% of the paper's steps"
    reversed_ = {"ndr": ([0.1, 0.12, 0.11], None), "transformer": ([1.0, 0.99, 1.0], None)}
    assert board.decide(evidence_of(reversed_))[0] == "not shown at this scale"
    assert board.decide(evidence_of(reversed_, paper_scale=True))[0] == "contradicted"
    assert board.decide(None)[0] == "not run"


def test_at_the_papers_scale_an_order_not_significant_is_not_reproduced_and_says_its_p():
    """At the paper's steps (ESBN: 3,000 of 3,000) an order within noise is no smaller scale's
    "not shown": the paper's scale was reached and the claim did not hold there."""
    noise = {"ndr": ([0.5, 0.3, 0.7], None), "transformer": ([0.4, 0.6, 0.45], None)}
    p = stats.two_sided_p([0.5, 0.3, 0.7], [0.4, 0.6, 0.45])
    assert board.decide(evidence_of(noise, paper_scale=True)) == (
        "not reproduced at the paper's scale",
        "at the paper's scale, the claimed order not significant at 0.05: "
        f"ndr against transformer, p = {p:.3g}",
    )
    behind = {"ndr": ([0.4, 0.6, 0.45], None), "transformer": ([0.5, 0.3, 0.7], None)}
    verdict, why = board.decide(evidence_of(behind, paper_scale=True))
    assert verdict == "not reproduced at the paper's scale" and why.endswith(f"p = {p:.3g}, reversed")
    solved = {"ndr": ([1.0, 1.0, 1.0], None), "transformer": ([1.0, 1.0, 1.0], None)}  # ESBN same/different
    assert board.decide(evidence_of(solved, paper_scale=True))[1].endswith("p = 1, tied")
    assert "not reproduced at the paper's scale" in board.VERDICTS


def test_a_claims_verdict_does_not_depend_on_how_many_checks_share_its_nightly_file(tmp_path, uri):
    """The same CTL night, alone in its nightly file and as one of eight (whose regression check
    runs each at alpha / 8): NDR ahead at p = 0.03 shows the order in both, at the board's 0.05."""
    scores = {"ndr": [0.5, 0.6, 0.7], "transformer": [0.3, 0.35, 0.4]}
    assert 0.05 / 8 < stats.two_sided_p(scores["ndr"], scores["transformer"]) < 0.05
    for name in [f"other{k}" for k in range(7)] + ["ctl"]:
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(ctl_ablation(n_iters=20)))
    found = {}
    for checks in (["ctl.yaml"], ["ctl.yaml"] + [f"other{k}.yaml" for k in range(7)]):
        nightly = tmp_path / f"nightly-{len(checks)}.yaml"
        nightly.write_text(yaml.safe_dump({"ablations": checks}))
        (file, text), *_ = nightly_files(str(nightly))
        spec = yaml.safe_load(text) if text else yaml.safe_load(Path(file).read_text())
        state = plant(tmp_path, uri, f"ctl-night-{len(checks)}", spec, scores)
        assert state.study().report.alpha == 0.05 / len(checks)
        context = board.build(tmp_path / "runs", [state], tmp_path / "runs" / "board")
        (entry,) = [
            e for paper in context["papers"] for e in paper["claims"] if e["claim"].id == "ndr-t1-ctl"
        ]
        found[len(checks)] = (entry["verdict"], entry["why"])
    assert (
        found[1]
        == found[8]
        == ("ordering shown", "in the claimed order, p < 0.05 for every pair, at a smaller scale")
    )


def test_every_published_table_has_a_claim_naming_our_models_tasks_and_their_keys():
    claims = board.load_claims()
    tables = {(cell["paper"], cell["table"]) for cell in papers.published_cells()}
    assert tables <= {(c.paper, c.table) for c in claims}
    for claim in claims:
        assert claim.task in TASKS, claim.id
        assert set(dict(claim.options)) <= papers.task_options(claim.task), claim.id
        for side in claim.better + claim.than:
            assert side.model in MODELS, (claim.id, side.model)
            known = papers.known_values(claim.task, {}, side.model)
            assert set(dict(side.setting)) <= set(known), (claim.id, side.label)


def test_a_claim_file_with_what_is_no_claim_is_refused_by_its_claim_and_key(tmp_path):
    path = tmp_path / "claims.yaml"
    good = yaml.safe_load(board.CLAIMS.read_text())[0]
    path.write_text(yaml.safe_dump([{**good, "column": {**good["column"], "when": "best"}}]))
    with pytest.raises(
        board.ClaimError, match=r"claims\[0\] \(ndr-t1-ctl\): column.when: expected at_best or final"
    ):
        board.load_claims(path)
    path.write_text(yaml.safe_dump([good, good]))
    with pytest.raises(board.ClaimError, match="claim ids used twice: ndr-t1-ctl"):
        board.load_claims(path)
