"""Members stacked with torch.func (trainables/batched.py) against separate runs of each member."""

import copy
import gc
import weakref

import pytest
import torch
from test_train import TINY_BY_KIND, TINY_TASK, TOY, tiny
from torch.func import functional_call, stack_module_state, vmap

from trainables import batched
from trainables.batched import Stack, clip_per_member, member_state_dict, train_members, train_seeds
from trainables.config import parse_trial_config
from trainables.graphs import bucket_widths
from trainables.kinds import SET_REGRESSION, VISUAL_QUESTION_ANSWERING
from trainables.models import BATCHABLE_MODELS, batchable, build_model
from trainables.tasks import load_task
from trainables.train import train

NO_DROPOUT = {"dropout": 0.0, "query_dropout": 0.0}


def close(separate: dict, batched: dict) -> None:
    """Every metric of a separate run equals the batched seed's within float32 rounding (the
    stacked matrix products sum in another order)."""
    assert separate.keys() == batched.keys()
    for key, value in separate.items():
        if key in ("status", "data_hash"):
            assert batched[key] == value
        elif key not in ("steps_per_s", "gpu_memory_mib"):  # how it ran, not what it learned
            assert batched[key] == pytest.approx(value, rel=1e-4, abs=1e-5), key


@pytest.mark.parametrize("model", BATCHABLE_MODELS)
def test_batched_seeds_equal_separate_runs(model):
    """Each seed keeps its own initialisation and its own data order (length buckets of its own):
    without dropout, the batched run is the separate runs, metric for metric."""
    seeds = [0, 3, 7]
    configs = {seed: tiny(model, seed=seed, length_bucketed=True, **NO_DROPOUT) for seed in seeds}
    batched = train_seeds(configs[0], seeds, log=None)
    for seed in seeds:
        close(train(configs[seed], log=None), batched[seed])
    assert len({batched[seed]["loss"] for seed in seeds}) == len(seeds)


def test_batched_set_regression_equals_separate_runs():
    """The Compositional Attention paper's set layer (Table 6's retrieval ablation)."""
    task, options = TINY_BY_KIND[SET_REGRESSION]
    flat = {
        "task": task,
        "model": "transformer_compositional",
        "task_options": options,
        "n_iters": 12,
        "eval_every": 6,
        "batch_size": 16,
        "lr": 1e-3,
        "d_model": 16,
        "n_heads": 2,
        "n_retrievals": 2,
    }
    batched = train_seeds(parse_trial_config(flat), [1, 2], log=None)
    for seed in (1, 2):
        close(train(parse_trial_config({**flat, "seed": seed}), log=None), batched[seed])


@pytest.mark.parametrize("retrieval_scores", ["dot", "mlp"])
def test_batched_sort_of_clevr_equals_separate_runs(retrieval_scores):
    """The Compositional Attention paper's Sort-of-CLEVR model: a convolution, pre-norm layers."""
    task, options = TINY_BY_KIND[VISUAL_QUESTION_ANSWERING]
    flat = {
        "task": task,
        "model": "transformer_compositional",
        "task_options": options,
        "n_iters": 12,
        "eval_every": 6,
        "batch_size": 16,
        "lr": 1e-3,
        "d_model": 16,
        "n_heads": 2,
        "n_layers": 2,
        "n_retrievals": 2,
        "retrieval_dim": 4,
        "retrieval_scores": retrieval_scores,
        **NO_DROPOUT,
    }
    batched = train_seeds(parse_trial_config(flat), [1, 2], log=None)
    for seed in (1, 2):
        close(train(parse_trial_config({**flat, "seed": seed}), log=None), batched[seed])


@pytest.mark.parametrize("optimizer", ["adamw", "adam", "rmsprop"])
def test_members_with_their_own_learning_rate_decay_and_clipping_equal_separate_runs(optimizer):
    """One stack of members that differ in seed, learning rate, weight decay and gradient clipping:
    each equals the run of its own config alone (the issue's "a stacked group with different
    learning rates / weight decays equals separate runs")."""
    members = [
        {"seed": 0, "lr": 1e-3, "weight_decay": 0.0, "grad_clip": 5.0},
        {"seed": 0, "lr": 3e-3, "weight_decay": 0.1, "grad_clip": 0.05},
        {"seed": 2, "lr": 3e-4, "weight_decay": 0.01, "grad_clip": None},
    ]
    cfg = tiny(
        "transformer_rel", optimizer=optimizer, momentum=0.9 if optimizer == "rmsprop" else 0.0, **NO_DROPOUT
    )
    stacked = train_members(cfg, members, log=None)
    for member, metrics in zip(members, stacked):
        close(
            train(
                tiny("transformer_rel", optimizer=optimizer, momentum=cfg.momentum, **member, **NO_DROPOUT),
                log=None,
            ),
            metrics,
        )
    assert len({m["loss"] for m in stacked}) == len(members)


@pytest.mark.long
def test_a_compiled_stack_trains_as_the_eager_stack_does():
    """compile: true on a stack compiles the vmapped forward and its backward (issue 21: fused
    kernels are what a stacked NDR step lacks); fusion reorders floating-point sums, so within the
    rounding that allows (test_train's single-model check: 1%). Members of their own rates."""
    members = [{"seed": 0, "lr": 1e-3}, {"seed": 1, "lr": 3e-3, "weight_decay": 0.1}]
    eager = train_members(tiny("ndr", **NO_DROPOUT), members, log=None)
    still_compiled = []
    compiled = train_members(
        tiny("ndr", compile=True, **NO_DROPOUT),
        members,
        log=None,
        report=lambda metrics, state, compiled: still_compiled.append(compiled),
    )
    assert still_compiled == [True, True]
    for a, b in zip(eager, compiled):
        assert b["loss"] == pytest.approx(a["loss"], rel=0.01)
        assert b["ood_valid_acc"] == pytest.approx(a["ood_valid_acc"], abs=0.02)


@pytest.mark.long  # torch.compile twice: the compiled path's other checks stay in the default run
def test_a_second_compiled_stack_of_another_size_trains_in_the_same_process(fresh_compiles):
    """Tune hands a finished trial's process the next trial (reuse_actors), in a search often of
    another size: its stack, compiled again, was recompiled with symbolic sizes that vmap cannot
    give, and failed on its first step (fell back uncompiled under compile: auto). And each stack
    compiles (here one width each): past torch's recompile limit (8 compiles of one function, here
    1 as if a process had used them) a stack trained uncompiled, with a log line only."""
    members = [{"seed": 0}, {"seed": 1}]
    with torch._dynamo.config.patch(recompile_limit=1):
        for compiled, d_model in enumerate((16, 32), start=1):
            results = train_members(
                tiny("ndr", compile=True, d_model=d_model, n_iters=2, eval_every=2, **NO_DROPOUT),
                members,
                log=None,
            )
            assert [r["status"] for r in results] == ["completed"] * 2
            assert fresh_compiles() == compiled


@pytest.mark.long  # torch.compile twice; test_graphs and the deeper stack keep compiled checks by default
def test_compiled_stacks_of_other_rates_share_their_compiled_step(fresh_compiles):
    """A rate held as a Python number was a constant of the compiled code: each trial of a search (a
    dropout of its own) compiled its step again, and a process reached torch's recompile limit in
    two or three trials. Rates live in tensors in every compiled stack."""
    members = [{"seed": 0}, {"seed": 1}]  # the same batches, so the same widths, in both
    for rates in ({"dropout": 0.1, "gate_drop": 0.1}, {"dropout": 0.3, "gate_drop": 0.0}):
        results = train_members(
            tiny("ndr", compile=True, n_iters=2, eval_every=2, **rates), members, log=None
        )
        assert [r["status"] for r in results] == ["completed"] * 2
        assert fresh_compiles() == 1


def test_a_finished_stack_is_freed_before_the_next_trial_builds_its_own(monkeypatch):
    """Tune hands a finished trial's process the next trial. A stack is garbage in a reference
    cycle (its step refers to it), which only Python's occasional full collection frees: on a GPU
    its weights, optimizer state and CUDA graphs stayed allocated into the next trial and counted
    in its gpu_memory_mib. Collections are off here, as between two of Python's."""
    built, alive_at_build = [], []

    def watched(*args, **kwargs):
        alive_at_build.append([ref() is not None for ref in built])
        stack = Stack(*args, **kwargs)
        built.append(weakref.ref(stack))
        return stack

    monkeypatch.setattr(batched, "Stack", watched)
    gc.disable()
    try:
        for _ in range(2):
            train_members(tiny("ndr", n_iters=2, eval_every=2), [{"seed": 0}, {"seed": 1}], log=None)
        assert built[1]() is not None  # the cycle: the last stack outlives train_members
    finally:
        gc.enable()
    assert alive_at_build == [[], [False]]


def test_a_compiled_stack_pads_its_batches_to_a_few_widths():
    """Compiled code is compiled once per shape. A stack compiled without a CUDA graph (on a CPU,
    under a cosine schedule, with cuda_graphs: false) took each batch at its own width: the
    authors' length-bucketed batches, one width after another, compiled the step at each."""
    deeper = {
        "task_options": {
            **TINY_TASK,
            "train_depths": [1, 6],
            "ood_valid_depths": [7, 7],
            "test_depths": [8, 8],
        },
        "length_bucketed": True,
        "batch_size": 4,
    }
    cfg = tiny("ndr", compile=True, **deeper)
    task = load_task(cfg.task, cfg.task_options)
    stack = Stack(cfg, [{"seed": 0}, {"seed": 1}], task, torch.device("cpu"), log=None)
    widths = {stack.next_batch()["tokens"].shape[-1] for _ in range(50)}
    assert widths <= set(bucket_widths(task.splits["train"].arrays["tokens"].shape[1]))
    unbucketed = Stack(tiny("ndr", **deeper), [{"seed": 0}, {"seed": 1}], task, torch.device("cpu"), log=None)
    assert len({unbucketed.next_batch()["tokens"].shape[-1] for _ in range(50)}) > len(
        widths
    )  # what it would have compiled


# the GPU's, abridged
INDUCTOR_ERROR = "expected size 512==512, stride 32==24 at dim=0\nThis error most often comes from ..."


class FailsBackward(torch.autograd.Function):
    """The identity whose backward fails, as the compiled backward of a single NDR did on CUDA."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        raise AssertionError(INDUCTOR_ERROR)


def compile_that_fails(where: str):
    """A torch.compile whose compiled function fails in its forward or in its backward."""

    def compile(fn, **_):
        def run(*args):
            if where == "forward":
                raise AssertionError(INDUCTOR_ERROR)
            return FailsBackward.apply(fn(*args))

        return run

    return compile


@pytest.mark.parametrize("where", ["forward", "backward"])
def test_a_compiled_step_that_fails_leaves_an_auto_compiled_stack_training_uncompiled(monkeypatch, where):
    """compile: auto compiles stacks on CUDA (here pretended: the config settles as on CUDA), where
    a compiler bug would otherwise cost the trial: the stack says why, then trains as the uncompiled
    stack does, from that very step. A stack of one member is not compiled at all."""
    from trainables.config import TrainConfig

    settled = TrainConfig.settled
    monkeypatch.setattr(
        TrainConfig, "settled", lambda self, device_type, members=1: settled(self, "cuda", members)
    )
    members = [{"seed": 0, "lr": 1e-3}, {"seed": 1, "lr": 3e-3}]
    eager = train_members(tiny("ndr", **NO_DROPOUT), members, log=None)
    monkeypatch.setattr(torch, "compile", compile_that_fails(where))
    lines = []
    still_compiled, states = [], []  # what each evaluation reports: the launch tags the trial's runs with it
    failed_over = train_members(
        tiny("ndr", compile="auto", **NO_DROPOUT),
        members,
        log=lines.append,
        report=lambda metrics, state, compiled: (still_compiled.append(compiled), states.append(state())),
    )
    assert still_compiled == [False, False]
    # Restored from a checkpoint, it trains uncompiled from the start, as it did before.
    restored_lines = []
    train_members(
        tiny("ndr", compile="auto", **NO_DROPOUT),
        members,
        log=restored_lines.append,
        resume_state=states[0],
        report=lambda metrics, state, compiled: still_compiled.append(compiled),
    )
    assert [line for line in restored_lines if "compiled step failed" in line] == [
        "[ctl/ndr] its compiled step failed before the checkpoint; training on uncompiled"
    ]
    assert still_compiled[2:] == [False]
    for a, b in zip(eager, failed_over):
        close(a, b)
    assert any(
        "parameters each on cpu, compiled;" in line for line in lines
    )  # what compile and bf16 resolved to
    said = [line for line in lines if "compiled step failed" in line]
    assert said == [
        "[ctl/ndr] the compiled step failed (AssertionError: expected size 512==512, stride 32==24 at "
        "dim=0); training on uncompiled"
    ]
    with pytest.warns(
        UserWarning, match="compiled step failed"
    ):  # where the trial logs nothing, as a launch's do
        train_members(tiny("ndr", compile="auto", **NO_DROPOUT), members, log=None)
    lines.clear()
    train_members(tiny("ndr", compile="auto", **NO_DROPOUT), members[:1], log=lines.append)
    assert not any("compiled" in line for line in lines)


def test_a_compile_asked_for_outright_fails_as_it_is(monkeypatch):
    """compile: true is a request to measure or to use the compiled step: its failure is the trial's."""
    monkeypatch.setattr(torch, "compile", compile_that_fails("backward"))
    with pytest.raises(AssertionError, match="stride 32==24"):
        train_members(tiny("ndr", compile=True, **NO_DROPOUT), [{"seed": 0}, {"seed": 1}], log=None)


def test_a_cosine_schedule_stacked_equals_separate_runs():
    """The annealed learning rate (lr_schedule: cosine) in a stack: members sharing their lr (the
    optimizer's own) and members with their own lr (scaled after the step) each equal their run
    alone, which a constant rate does not."""
    cosine = dict(optimizer="adamw", lr_schedule="cosine", **NO_DROPOUT)
    for members in (
        [{"seed": 0}, {"seed": 1}],
        [{"seed": 0, "lr": 1e-3}, {"seed": 1, "lr": 4e-3, "weight_decay": 0.1}],
    ):
        stacked = train_members(tiny("transformer_rel", **cosine), members, log=None)
        for member, metrics in zip(members, stacked):
            close(train(tiny("transformer_rel", **{**cosine, **member}), log=None), metrics)
    constant = train(
        tiny("transformer_rel", **{**cosine, "lr_schedule": "constant"}, seed=1, lr=4e-3, weight_decay=0.1),
        log=None,
    )
    assert constant["loss"] != pytest.approx(stacked[1]["loss"], rel=1e-4)


def test_a_member_sets_only_what_may_differ():
    with pytest.raises(ValueError, match="at most seed, lr, weight_decay, grad_clip"):
        train_members(tiny("ndr"), [{"seed": 0}, {"seed": 1, "d_model": 32}], log=None)


def test_each_seed_draws_its_own_dropout():
    """Two copies of one model, stacked: in training their dropout masks differ, so their outputs
    do; in evaluation they are the same model."""
    torch.manual_seed(0)
    model = build_model("ndr", {"d_model": 16, "n_heads": 2, "n_layers": 2, "dropout": 0.5}, TOY)
    params, buffers = stack_module_state([model, copy.deepcopy(model)])
    skeleton = copy.deepcopy(model).to("meta")
    tokens, lengths = torch.tensor([[3, 4, 5, 6]]), torch.tensor([4])

    def run(training: bool) -> torch.Tensor:
        skeleton.train(training)
        return vmap(
            lambda p, b: functional_call(skeleton, (p, b), (tokens, lengths)), randomness="different"
        )(params, buffers)

    trained = run(True)
    assert not torch.allclose(trained[0], trained[1])
    evaluated = run(False)
    torch.testing.assert_close(evaluated[0], evaluated[1])


@pytest.mark.parametrize("by", ["norm", "value"])
def test_clipping_is_each_members_own(by):
    """clip_per_member on stacked gradients = torch's clipping of each member's gradients alone, at
    the member's own limit."""
    torch.manual_seed(0)
    grads = [torch.randn(3, 5, 4) * torch.tensor([0.01, 1.0, 30.0])[:, None, None], torch.randn(3, 7) * 10]
    limits = [1.0, 0.5, 2.0]
    clipped = [g.clone() for g in grads]
    clip_per_member(by, torch.tensor(limits), clipped)
    for k in range(3):
        alone = [torch.nn.Parameter(torch.zeros_like(g[k])) for g in grads]
        for p, g in zip(alone, grads):
            p.grad = g[k].clone()
        if by == "norm":
            torch.nn.utils.clip_grad_norm_(alone, limits[k])
        else:
            torch.nn.utils.clip_grad_value_(alone, limits[k])
        for mine, theirs in zip(clipped, alone):
            torch.testing.assert_close(mine[k], theirs.grad)


def test_resume_from_a_batched_snapshot_continues_exactly():
    states = {}
    cfg = tiny("transformer_rel", length_bucketed=True)
    full = train_seeds(
        cfg,
        [0, 1],
        report=lambda metrics, state, compiled: states.setdefault(metrics[0]["iteration"], state()),
        log=None,
    )
    resumed = train_seeds(cfg, [0, 1], resume_state=states[6], log=None)
    for seed in (0, 1):
        assert resumed[seed]["loss"] == pytest.approx(full[seed]["loss"], rel=1e-5)
        assert resumed[seed]["test_acc_at_best"] == full[seed]["test_acc_at_best"]


def test_a_seeds_weights_load_into_a_model_of_its_own():
    """What the report's attention maps load from a checkpoint of batched seeds
    (orchestrator/report/maps.py)."""
    states = []
    cfg = tiny("ndr", **NO_DROPOUT)
    train_seeds(cfg, [4, 9], report=lambda metrics, state, compiled: states.append(state()), log=None)
    alone = {}
    train(tiny("ndr", seed=9, **NO_DROPOUT), report=lambda metrics, state: alone.update(state()), log=None)
    mine = member_state_dict(states[-1], 1)
    assert mine.keys() == alone["model"].keys()
    for name, value in alone["model"].items():
        torch.testing.assert_close(mine[name], value, rtol=1e-4, atol=1e-5)


def test_a_diverged_seed_stops_alone():
    """A NaN in one seed's parameters stays in that seed: it is reported diverged, the other trains
    on; a resume from a later snapshot keeps it diverged where it diverged."""
    reports, states = [], {}

    def report(metrics, state, compiled):
        reports.append([dict(m) for m in metrics])
        states[metrics[0]["iteration"]] = state()

    cfg = tiny("ndr", n_iters=12, eval_every=4)
    original = torch.optim.AdamW.step

    def poison_seed_1(self, *args, **kwargs):  # after the first step, seed 1's weights become NaN
        out = original(self, *args, **kwargs)
        for group in self.param_groups:
            for p in group["params"]:
                p.data[1] = float("nan")
        torch.optim.AdamW.step = original
        return out

    torch.optim.AdamW.step = poison_seed_1
    try:
        final = train_seeds(cfg, [0, 1], report=report, log=None)
    finally:
        torch.optim.AdamW.step = original
    assert final[1]["status"] == "diverged" and final[1]["iteration"] == 4
    assert final[0]["status"] == "completed" and final[0]["iteration"] == 12
    assert [r[0]["iteration"] for r in reports] == [4, 8, 12]
    resumed = train_seeds(cfg, [0, 1], resume_state=states[8], log=None)
    assert (resumed[1]["status"], resumed[1]["iteration"]) == ("diverged", 4) and resumed[0][
        "status"
    ] == "completed"


@pytest.mark.parametrize(
    "flat, reason",
    [
        ({"model": "lstm"}, "host-side control flow"),
        ({"model": "ndr", "act": "graves"}, "adaptive computation time"),
    ],
)
def test_models_that_cannot_be_batched_say_why(flat, reason):
    assert reason in batchable(flat)
    with pytest.raises(ValueError, match=reason):
        train_seeds(tiny(flat["model"], **{k: v for k, v in flat.items() if k != "model"}), [0, 1], log=None)


def test_members_without_a_seed_are_a_searchs_suggestions_trained_from_the_trials_seed():
    """A stacked search trial's members set only what TPE proposed: each trains from the trial's
    seed, as its own search trial would, and equals that trial run alone."""
    cfg = tiny("transformer_rel", seed=3, **NO_DROPOUT)
    members = [{"lr": 1e-3, "weight_decay": 0.0}, {"lr": 3e-3, "weight_decay": 0.1}]
    for member, metrics in zip(members, train_members(cfg, members, log=None)):
        close(train(tiny("transformer_rel", seed=3, **member, **NO_DROPOUT), log=None), metrics)


def test_the_throughput_curve_times_each_stack_size_and_its_knee_is_where_it_flattens():
    from orchestrator.run.stacking import knee
    from trainables.batched import member_steps_per_second

    curve = member_steps_per_second(tiny("ndr"), [1, 2], steps=2)
    assert [n for n, _ in curve] == [1, 2] and all(rate > 0 for _, rate in curve)
    measured = [(1, 9.0), (2, 17.5), (4, 33.0), (8, 60.0), (16, 64.0), (32, 65.0)]
    assert knee(measured) == 8 and knee(measured, within=1.0) == 32 and knee([(1, 5.0), (2, 3.0)]) == 1


def test_a_groups_throughput_counts_the_stack_of_its_rest():
    """group_rate against the group trained stack by stack as Stacking.trials cuts it (no member left
    alone where the size allows: the last full stack gives one to the rest), each stack's rate read
    off the curve or, between two measured sizes, off the line joining them."""
    from orchestrator.run.stacking import group_rate, knee, stack_cuts

    def rate_at(curve, n):
        rates = dict(curve)
        if n in rates:
            return rates[n]
        below, above = max(m for m in rates if m < n), min(m for m in rates if m > n)
        return rates[below] + (rates[above] - rates[below]) * (n - below) / (above - below)

    def slow(curve, members, size):
        stacks = [len(range(members)[start : start + size]) for start in range(0, members, size)]
        if len(stacks) > 1 and stacks[-1] == 1 and size > 2:
            stacks[-2] -= 1
            stacks[-1] += 1
        return members / sum(n / rate_at(curve, n) for n in stacks)

    curves = [
        [(1, 46.7), (2, 79.0), (4, 132.4), (5, 134.9)],
        [(1, 9.0), (2, 17.5), (4, 33.0), (8, 60.0), (16, 64.0), (20, 66.0)],
    ]
    for curve in curves:
        for members in (5, 7, 20, 23):
            for size, _ in curve:
                assert group_rate(curve, members, size) == pytest.approx(slow(curve, members, size))
    # NDR on CTL backward, measured in a launch on an H100: three and two would take 45% longer than five
    assert knee(curves[0], members=5) == 5 and knee(curves[0], members=8) == 4
    assert (
        stack_cuts(5, 4) == [3, 2]
        and stack_cuts(9, 4) == [4, 3, 2]
        and stack_cuts(5, 2) == [2, 2, 1]
        and stack_cuts(4, 4) == [4]
    )


@pytest.mark.parametrize(
    "model, rates", [("transformer_rel", {"dropout": 0.3, "query_dropout": 0.2}), ("ndr", {"gate_drop": 0.4})]
)
def test_each_member_drops_at_its_own_rate(model, rates):
    """Members that differ only in dropout (or gate-drop) rates share a stack: the member at rate 0
    equals its run alone, with no dropout at all; the member beside it in the same stack does drop."""
    off = {**NO_DROPOUT, **{k: 0.0 for k in rates}}
    cfg = tiny(model, **off)
    members = [{"seed": 1, **off}, {"seed": 1, **rates}]
    without, with_rates = train_members(cfg, members, log=None)
    close(train(tiny(model, seed=1, **off), log=None), without)
    assert with_rates["loss"] != without["loss"]
