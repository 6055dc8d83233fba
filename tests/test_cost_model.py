"""The dry run's cost model (orchestrator/run/cost_model.py): measured step rates scaled to a trial's
size, and the basis said beside each figure; evaluations priced from their sets' sizes."""

import math

import pytest

from orchestrator.run import cost_model
from orchestrator.run.cost_model import measured, seconds_per_step
from trainables.models import MODELS
from trainables.tasks import TASKS, eval_sizes, load_task
from trainables.tasks.base import throwaway_data_cache


def row(model, task, device, members=1):
    return next(
        r for r in measured() if (r.model, r.task, r.device, r.members) == (model, task, device, members)
    )


def test_every_row_names_a_model_and_task_that_exist_and_a_positive_rate():
    assert measured()
    for r in measured():
        assert r.model in MODELS and r.task in TASKS and r.device in ("cpu", "cuda"), r
        assert r.members >= 1 and r.batch >= 1 and r.params >= 1 and r.steps_per_s > 0, r


def test_a_measured_size_costs_what_was_measured_and_a_cpu_step_scales_with_its_work():
    ndr = max(
        (r for r in measured() if (r.model, r.task, r.device) == ("ndr", "ctl", "cpu")),
        key=lambda r: r.params,
    )
    per_step, basis = seconds_per_step("ndr", "ctl", "cpu", ndr.params, ndr.batch)
    assert per_step == pytest.approx(1 / ndr.steps_per_s) and "ndr on ctl" in basis
    assert seconds_per_step("ndr", "ctl", "cpu", ndr.params, ndr.batch * 2)[0] == pytest.approx(
        2 / ndr.steps_per_s
    )


def test_between_two_measured_sizes_a_step_is_interpolated_in_log_log():
    """A small model's step is more overhead than arithmetic: between two of a model's rows its
    time follows the line through them in log-log, not its work (beyond them, its work)."""
    small, large = sorted(
        (r for r in measured() if (r.model, r.task, r.device) == ("panm", "copy", "cpu")),
        key=lambda r: r.params * r.batch,
    )
    middle = math.sqrt(small.params * small.batch * large.params * large.batch)
    per_step, basis = seconds_per_step("panm", "copy", "cpu", round(middle / 64), 64)
    assert per_step == pytest.approx(1 / math.sqrt(small.steps_per_s * large.steps_per_s), rel=1e-4)
    assert basis.startswith("cost model between panm on copy: ") and ", interpolated to " in basis


def test_on_a_gpu_a_smaller_step_costs_no_less_and_a_stack_is_priced_by_its_members_rate():
    lone, stacked = row("ndr", "ctl", "cuda"), row("ndr", "ctl", "cuda", 5)
    assert seconds_per_step("ndr", "ctl", "cuda", lone.params // 10, lone.batch)[0] == pytest.approx(
        1 / lone.steps_per_s
    )
    per_member, basis = seconds_per_step("ndr", "ctl", "cuda", stacked.params, stacked.batch, members=5)
    assert per_member == pytest.approx(1 / stacked.steps_per_s) and "stacks of 5" in basis
    # a stack of 3: no row that large or smaller but the lone one
    assert seconds_per_step("ndr", "ctl", "cuda", lone.params, lone.batch, members=3)[0] == pytest.approx(
        1 / lone.steps_per_s
    )


def test_without_a_row_of_its_own_a_model_is_priced_by_the_others_and_says_so():
    cpu = row("transformer_rel", "ctl", "cpu")
    gpu, basis = seconds_per_step("transformer_rel", "ctl", "cuda", cpu.params, cpu.batch)
    assert basis.startswith("cost model from no GPU measurement of transformer_rel")
    assert gpu == pytest.approx(1 / cpu.steps_per_s / cost_model.gpu_speedup())
    assert 10 < cost_model.gpu_speedup() < 1000  # the CPU rows are 2 cores, the GPU rows an H200
    _, basis = seconds_per_step("examples/my_model.py:Net", "copy", "cpu", 10_000, 64)
    assert "no measurement of examples/my_model.py:Net: the median cost per parameter-sample" in basis


def test_orchestrator_train_says_its_cost_before_it_starts():
    sizes = eval_sizes("ctl", {})
    line = cost_model.training_cost("ndr", "ctl", "cpu", 43_661, 64, 1000, 300, sizes)
    evaluating = 4 * cost_model.evaluation_seconds(1 / 42.27, 64, sizes)  # at 300, 600, 900 and 1,000
    assert line.startswith(
        "cost: 1,000 training steps of batch 64 at about 42.3 steps/s on cpu = 24 s, and 4 evaluation(s) = "
        "at most "
        f"{cost_model.hours(evaluating)}: at most {cost_model.hours(1000 / 42.27 + evaluating)} (by the "
    ), line
    unknown = cost_model.training_cost("ndr", "ctl", "cpu", 43_661, 64, 1000, 300, None)
    assert "= 24 s (evaluations left out: their sets' sizes come with the data; by the " in unknown


def test_an_evaluation_is_priced_by_its_sets_rows_times_their_length():
    """Every set a trial scores, validation and tests alike (an upper bound: tests run where a
    checkpoint is kept), a position at FORWARD_SHARE of a trained one; a kind that decodes greedily
    calls its model once per output position."""
    sizes = eval_sizes("copy", {"eval_size": 100})  # trained on lengths 1..9: 10 positions a sample
    positions = 100 * (10 + 20) + 100 * (18 + 20 + 40 + 80 + 160)  # iid, L+1; L, 10, 20, 40, 80 long
    per_step, batch = 0.2, 128
    assert cost_model.evaluation_seconds(per_step, batch, sizes) == pytest.approx(
        cost_model.FORWARD_SHARE * per_step / (batch * 10) * positions
    )
    scan = eval_sizes("scan", {"length_cutoff": 26, "eval_size": 500})
    assert (
        scan.decodes and not sizes.decodes and [s.rows for s in (*scan.validation, *scan.tests)] == [500, 500]
    )
    held, test = scan.validation[0], scan.tests[0]
    assert cost_model.evaluation_seconds(per_step, batch, scan) == pytest.approx(
        cost_model.FORWARD_SHARE
        * per_step
        / (batch * scan.train_length)
        * 500
        * (held.length * held.outputs + test.length * test.outputs)
    )
    assert cost_model.evaluations(1000, 300) == 4 and cost_model.evaluations(1000, 200) == 5


@pytest.mark.parametrize(
    "task, options",
    [
        ("copy", {"eval_size": 40}),
        ("priority_sort", {"eval_size": 40, "ood_valid_length": 14}),
        ("ctl", {"train_size": 600, "eval_size": 90}),
        ("dyck", {"eval_size": 300, "train_size": 300}),
        ("contextual_retrieval", {"eval_size": 30}),
        ("triangles", {"eval_size": 30}),
        ("esbn", {"eval_size": 30, "train_size": 200, "test_size": 50}),
        ("sort_of_clevr", {"eval_images": 2, "train_images": 2}),
        ("scan", {"eval_size": 200}),
    ],
)
def test_eval_sizes_are_the_sets_a_task_builds(task, options):
    """Known without the data, they match the data: each set scored (once where it fills both
    validation slots), its rows, and its mean length within 15% (a depth range's middle for CTL,
    half the cap for Dyck's training strings)."""
    sizes = eval_sizes(task, options)
    with throwaway_data_cache():
        built = load_task(task, options)
    scored = {"iid_valid", *([] if built.splits["ood_valid"] is built.splits["iid_valid"] else ["ood_valid"])}
    assert [s.name for s in sizes.validation] == sorted(scored) and [s.name for s in sizes.tests] == list(
        built.test_splits
    )
    for s in (*sizes.validation, *sizes.tests):
        split = built.splits[s.name]
        assert s.rows == len(split), s
        if "lengths" in split.arrays:
            outputs = (
                split.target_lengths
                if "target_lengths" in split.arrays and built.kind.name != "next_symbol_sets"
                else 0
            )
            assert s.length == pytest.approx(float((split.lengths + outputs).mean()), rel=0.15), s
