"""The CUDA-graph step (trainables/graphs.py): what runs on the CPU is checked here, the capture
itself where there is a GPU. Padding to a bucket width leaves every sample's result unchanged, and
the graphed step's machinery (bucketed batches, static inputs, the warm-up undone in place)
trains exactly as the eager step does."""

import numpy as np
import pytest
import torch
from test_batched import NO_DROPOUT, close
from test_train import tiny

from trainables import graphs, steps
from trainables.batches import batch_tensors
from trainables.devices import pick_device
from trainables.models import BATCHABLE_MODELS
from trainables.steps import forward_loss, make_model
from trainables.tasks import load_task
from trainables.train import train


def test_bucket_widths_are_a_few_fixed_steps_up_to_the_longest():
    assert graphs.bucket_widths(10) == [3, 6, 9, 10] and graphs.bucket_widths(3) == [1, 2, 3]
    assert [graphs.pick_width(w, [3, 6, 9, 10]) for w in (1, 3, 4, 10)] == [3, 3, 6, 10]


@pytest.mark.parametrize("model", BATCHABLE_MODELS)
def test_padding_a_batch_wider_gives_every_sample_the_same_output_loss_and_gradients(model):
    """What bucketing relies on: a batch padded wider than its longest row (with the pad token)
    gives each sample the output, and the batch the loss and gradients, of the trimmed batch."""
    cfg = tiny(model, **NO_DROPOUT)
    task = load_task(cfg.task, cfg.task_options)
    split, device = task.splits["train"], torch.device("cpu")
    trimmed = batch_tensors(split, np.arange(16), device)
    padded = {**trimmed, "tokens": torch.nn.functional.pad(trimmed["tokens"], (0, 3))}
    results = []
    for batch in (trimmed, padded):
        torch.manual_seed(0)
        net = make_model(cfg, task).eval()
        out, loss = forward_loss(cfg, net, task.kind, batch, device)
        loss.backward()
        results.append((out, loss, [p.grad for p in net.parameters() if p.grad is not None]))
    (out, loss, grads), (out_padded, loss_padded, grads_padded) = results
    assert torch.allclose(out_padded, out, atol=1e-5) and torch.allclose(loss_padded, loss, atol=1e-6)
    assert len(grads) == len(grads_padded) and all(
        torch.allclose(a, b, atol=1e-5) for a, b in zip(grads_padded, grads)
    )


def test_bucketed_batches_take_a_bucket_width():
    cfg = tiny("ndr")
    split = load_task(cfg.task, cfg.task_options).splits["train"]
    widths = graphs.bucket_widths(split.arrays["tokens"].shape[1])
    for rows in (np.arange(16), np.argsort(split.lengths)[:16]):
        tokens = batch_tensors(split, rows, torch.device("cpu"), bucketed=True)["tokens"]
        assert tokens.shape[1] in widths and tokens.shape[1] >= split.lengths[rows].max()


@pytest.mark.parametrize(
    "model, optimizer", [("ndr", "adamw"), ("transformer_rel", "rmsprop"), ("transformer", "adam")]
)
def test_the_graphed_step_machinery_trains_as_the_eager_step_does(model, optimizer, monkeypatch):
    """On the CPU the 'graph' is the step called on its static inputs (GraphedStep's eager_replay):
    bucketed batches, the copy into the static inputs, and three warm-up steps per shape whose
    updates are undone in place, also for a shape first seen mid-run (length-bucketed batches come
    in several widths); the run equals the eager one."""
    settings = {
        "optimizer": optimizer,
        "length_bucketed": True,
        **({"momentum": 0.9} if optimizer == "rmsprop" else {}),
        **NO_DROPOUT,
    }
    eager = train(tiny(model, **settings), log=None)
    monkeypatch.setattr(steps, "graphs_unused_because", lambda cfg, device: None)
    captured = []
    monkeypatch.setattr(
        graphs.GraphedStep,
        "capture",
        lambda self, batch, real=graphs.GraphedStep.capture: captured.append(1) or real(self, batch),
    )
    graphed = train(tiny(model, **settings), log=None)
    assert len(captured) > 1  # the graphed path ran, a capture per batch shape
    close(eager, graphed)


def test_cuda_graphs_false_and_the_cpu_step_eagerly():
    cfg = tiny("ndr")
    assert graphs.graphs_unused_because(cfg, torch.device("cpu")) == "CUDA graphs need a CUDA device, not cpu"
    assert (
        graphs.graphs_unused_because(tiny("ndr", cuda_graphs=False), torch.device("cuda"))
        == "cuda_graphs: false"
    )
    assert (
        graphs.graphs_unused_because(tiny("lstm"), torch.device("cuda"))
        == "model 'lstm' steps through its input with host-side control flow"
    )
    assert graphs.graphs_unused_because(tiny("ndr", compile=True), torch.device("cuda")).startswith(
        "compile: "
    )
    assert graphs.graphs_unused_because(tiny("ndr"), torch.device("cuda")) is None
    assert (
        graphs.graphs_unused_because(tiny("ndr", compile="auto"), torch.device("cuda")) is None
    )  # auto compiles stacks only
    # A stack's compiled step keeps the graph, as `auto` settles a stack on CUDA; torch's own graphing
    # modes keep theirs instead.
    assert (
        graphs.graphs_unused_because(
            tiny("ndr", compile="auto", bf16="auto").settled("cuda", 5), torch.device("cuda"), stacked=True
        )
        is None
    )
    assert graphs.graphs_unused_because(tiny("ndr", compile=True), torch.device("cuda"), stacked=True) is None
    assert (
        graphs.graphs_unused_because(
            tiny("ndr", compile="max-autotune-no-cudagraphs"), torch.device("cuda"), stacked=True
        )
        is None
    )
    for mode in ("reduce-overhead", "max-autotune"):
        assert (
            graphs.graphs_unused_because(tiny("ndr", compile=mode), torch.device("cuda"), stacked=True)
            == f"compile: {mode} captures CUDA graphs of its own"
        )


@pytest.mark.parametrize("stacked", [False, True])
def test_a_graphed_run_with_dropout_resumes_exactly(stacked, monkeypatch):
    """A resumed run captures its batch widths again, at other steps than the run it resumes: the
    warm-up before each capture draws no random numbers the run would have, so its dropout goes on
    as the uninterrupted run's. Graphed (on the CPU, the eager replay; on a GPU, real captures, and
    the device's generator kept in the checkpoint), alone and stacked, with NDR's dropout and
    gate-drop, over batches of several widths."""
    from trainables import batched

    cfg, states = tiny("ndr", length_bucketed=True, dropout=0.3, gate_drop=0.2), {}
    monkeypatch.setattr(steps, "graphs_unused_because", lambda cfg, device: None)
    monkeypatch.setattr(batched, "graphs_unused_because", lambda cfg, device, stacked: None)
    if stacked:
        members = [{"seed": 0, "lr": 1e-3}, {"seed": 1, "lr": 3e-3}]
        full = batched.train_members(
            cfg,
            members,
            report=lambda ms, state, compiled: states.setdefault(ms[0]["iteration"], state()),
            log=None,
        )
        resumed = batched.train_members(cfg, members, resume_state=states[6], log=None)
    else:
        full = [train(cfg, report=lambda m, state: states.setdefault(m["iteration"], state()), log=None)]
        resumed = [train(cfg, resume_state=states[6], log=None)]
    assert [r["loss"] for r in resumed] == pytest.approx([r["loss"] for r in full], rel=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU: the capture itself")
@pytest.mark.parametrize("model", ["ndr", "transformer_rel"])
def test_on_cuda_the_graphed_step_equals_the_eager_step(model):
    """Issue 21: "the graphed step equals the eager step (no dropout) within float tolerance on CUDA"."""
    assert pick_device("auto").type == "cuda"
    eager = train(tiny(model, cuda_graphs=False, **NO_DROPOUT), log=None)
    graphed = train(tiny(model, **NO_DROPOUT), log=None)
    close(eager, graphed)


def test_a_stack_of_members_trains_graphed_as_it_does_eagerly(monkeypatch):
    """The stacked step (trainables.batched.Stack) through the same machinery: members of their own
    learning rates and decays, batches of several widths; every member's run equals the eager stack's."""
    from trainables import batched

    cfg = tiny("transformer_rel", length_bucketed=True, **NO_DROPOUT)
    members = [{"seed": 0, "lr": 1e-3}, {"seed": 1, "lr": 3e-3, "weight_decay": 0.1}]
    eager = batched.train_members(cfg, members, log=None)
    monkeypatch.setattr(batched, "graphs_unused_because", lambda cfg, device, stacked: None)
    captured = []
    monkeypatch.setattr(
        graphs.GraphedStep,
        "capture",
        lambda self, batch, real=graphs.GraphedStep.capture: captured.append(1) or real(self, batch),
    )
    graphed = batched.train_members(cfg, members, log=None)
    assert len(captured) > 1
    for a, b in zip(eager, graphed):
        close(a, b)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU: the capture itself")
def test_on_cuda_a_graphed_stack_equals_the_eager_stack():
    from trainables.batched import train_members

    members = [{"seed": 0, "lr": 1e-3}, {"seed": 1, "lr": 3e-3, "weight_decay": 0.1}]
    eager = train_members(
        tiny("ndr", cuda_graphs=False, length_bucketed=True, **NO_DROPOUT), members, log=None
    )
    graphed = train_members(tiny("ndr", length_bucketed=True, **NO_DROPOUT), members, log=None)
    for a, b in zip(eager, graphed):
        close(a, b)
    assert all(
        0 < result["gpu_memory_mib"] < torch.cuda.get_device_properties(0).total_memory / 2**20
        for result in graphed
    )


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU: the capture itself")
def test_on_cuda_a_compiled_stack_can_be_graphed():
    """Why a compiled stack keeps its CUDA graph (passed on an H200, 2026-11-27): the compiled
    stack, captured, trains as the eager stack does without dropout; and with dropout and a
    learning rate of 0, replays of one batch draw fresh masks (the compiled kernels' random numbers
    advance with each replay)."""
    from trainables import batched

    members = [{"seed": 0, "lr": 1e-3}, {"seed": 1, "lr": 3e-3, "weight_decay": 0.1}]
    eager = batched.train_members(
        tiny("ndr", cuda_graphs=False, length_bucketed=True, **NO_DROPOUT), members, log=None
    )
    graphed = batched.train_members(
        tiny("ndr", compile=True, length_bucketed=True, **NO_DROPOUT), members, log=None
    )
    for a, b in zip(eager, graphed):
        assert b["loss"] == pytest.approx(a["loss"], rel=0.01)
    cfg = tiny("ndr", compile=True, lr=0.0, dropout=0.5)
    stack = batched.Stack(
        cfg, [{"seed": 0}, {"seed": 1}], load_task(cfg.task, cfg.task_options), torch.device("cuda")
    )
    assert stack.graphed
    batch = batched.stacked_batch(
        [next_batch() for next_batch, _ in stack.sources], stack.device, bucketed=True
    )
    losses = [stack.run(batch)[0].clone() for _ in range(4)]
    assert len({tuple(loss.tolist()) for loss in losses}) == 4
    # As a launch's stacks run by default (compile: auto, bf16: auto): graphed, in bf16 autocast, and it
    # learns.
    auto = tiny("ndr", compile="auto", bf16="auto", length_bucketed=True, n_iters=60, eval_every=30)
    stack = batched.Stack(auto, members, load_task(auto.task, auto.task_options), torch.device("cuda"))
    assert stack.graphed and stack.cfg.compile and stack.cfg.bf16
    losses = torch.stack(
        [stack.step()[0].clone() for _ in range(60)]
    )  # a CPU's eager stack: 2.13 -> 2.08 (first and last ten)
    assert torch.isfinite(losses).all() and (losses[-10:].mean(0) < losses[:10].mean(0)).all()
