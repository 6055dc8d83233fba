"""The dry run's cost model (orchestrator/run/cost_model.py): measured step rates scaled to a trial's
size, and the basis said beside each figure."""

import pytest

from orchestrator.run import cost_model
from orchestrator.run.cost_model import measured, seconds_per_step
from trainables.models import MODELS
from trainables.tasks import TASKS


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
    line = cost_model.training_cost("ndr", "ctl", "cpu", 43_661, 64, 1000)
    assert line.startswith("cost: 1,000 training steps at about 42.3 steps/s on cpu = 0.4 min")
