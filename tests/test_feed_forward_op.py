"""The feed-forward sublayer as one op (trainables/models/feed_forward_op.py, `fused_feed_forward`):
its Triton kernels in Triton's interpreter (no GPU here), its CPU path, and a model built with it
against the same model without."""

import itertools
import os
import subprocess
import sys

import pytest
import torch
from test_train import tiny

from trainables.batched import Stack
from trainables.models.feed_forward_op import feed_forward, keep_on_cpu, reference
from trainables.tasks import load_task

NO_DROPOUT = {"dropout": 0.0, "query_dropout": 0.0}
SIZES = {"d_model": 64, "ff_multiplier": 2}  # the kernels' smallest: a gate's hidden layer of 64


def sublayer(members=2, rows=100, d=32, hidden=128, seed=0):
    torch.manual_seed(seed)
    return (
        torch.randn(members, rows, d, requires_grad=True),
        (torch.randn(members, hidden, d) / d**0.5).requires_grad_(),
        (0.1 * torch.randn(members, hidden)).requires_grad_(),
        (torch.randn(members, d, hidden) / hidden**0.5).requires_grad_(),
    )


def in_the_interpreter() -> None:
    """Triton's kernels, each member its own rate and seed, rows that do not fill the last block: the
    output and every gradient equal PyTorch's with the kernels' own mask. Run in a process of its
    own: the interpreter must be on before triton is first imported (its library's functions are
    built then), and torch imports triton early. In float32: the interpreter's tl.dot multiplies
    bf16 tiles wrongly (a 16 x 16 product of its own was off by 2e10); bf16 is checked on a GPU,
    by the CUDA test below and benchmarks/ff_kernel.py."""
    from trainables.models import feed_forward_triton as kernels

    # one block each: the autotuner times its candidates on a GPU only
    kernels._forward.configs, kernels._backward_rows.configs = (
        kernels.configs([(64, 32, 1, 4)]),
        kernels.configs([(64, 32, 1, 4)]),
    )
    a, w1, b1, w2 = sublayer()
    rate, seed = torch.tensor([0.0, 0.4]), torch.tensor([7, 8])
    grad = torch.randn_like(a)
    y = kernels.forward(a.detach(), w1.detach(), b1.detach(), w2.detach(), rate, seed)
    keep = kernels.kept(a.shape[1], w1.shape[1], rate, seed)
    expected = reference(a, w1, b1, w2, rate, keep)
    torch.testing.assert_close(y, expected, rtol=1e-5, atol=1e-5)
    wanted = torch.autograd.grad(expected, [a, w1, b1, w2], grad)
    # the weight gradients summed by one program a block, and by two, atomically
    for split in (1, 2):
        kernels._backward_weights.configs = kernels.configs([(64, 32, 1, 4, split)])
        got = kernels.backward(grad, a.detach(), w1.detach(), b1.detach(), w2.detach(), rate, seed)
        for g, want in zip(got, wanted):
            torch.testing.assert_close(g, want, rtol=1e-5, atol=2e-5)
    assert keep[0].all() and abs(keep[1].float().mean().item() - 0.6) < 0.02
    # the four units that share a Philox draw take its four numbers: neighbours are uncorrelated
    kept_at = keep[1].float() - 0.6
    for step in (1, 2, 3):
        assert abs((kept_at[:, :-step] * kept_at[:, step:]).mean().item() / 0.24) < 0.06


def test_the_triton_kernels_compute_the_sublayer_and_its_gradients():
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="the kernels compiled for a GPU (benchmarks/gpu_session.sh runs this there)",
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_on_cuda_the_op_computes_the_sublayer_and_its_gradients(dtype):
    """The op on CUDA, through autograd: what the interpreter checks, compiled for the GPU, in bf16
    too. tl.dot rounds float32 to TF32, so within TF32's (or bf16's) rounding."""
    from trainables.models import feed_forward_triton as kernels

    a, w1, b1, w2 = (
        t.detach().cuda().requires_grad_() for t in sublayer(members=3, rows=1000, d=256, hidden=512)
    )
    a_in = a.to(dtype)
    rate, seed = torch.tensor([0.0, 0.1, 0.5], device="cuda"), torch.tensor([1, 2, 3], device="cuda")
    y = feed_forward(a_in, w1, b1, w2, rate, seed)
    # The kernels add up bf16 products in float32 and take the ReLU of that sum; PyTorch's bf16
    # sublayer rounds the sum to bf16 first, which flips units near zero and, in the backward,
    # their whole gradient. So bf16 is held to float32 arithmetic on the bf16-rounded inputs.
    rounded = [t.to(dtype).float() if dtype == torch.bfloat16 else t for t in (a, w1, b1, w2)]
    expected = reference(*rounded, rate, kernels.kept(a.shape[1], w1.shape[1], rate, seed))
    tolerance = {"rtol": 2e-2, "atol": 2e-2} if dtype == torch.bfloat16 else {"rtol": 5e-3, "atol": 5e-3}
    torch.testing.assert_close(y.float(), expected.float(), **tolerance)
    grad = torch.randn_like(y)
    # A unit whose sum is within float32's rounding of 0 may still fall on either side of the ReLU
    # (on an H200 one of 1.5 million did, in bf16): its row's gradient in a is left out.
    pre = (
        torch.matmul(rounded[0].detach().double(), rounded[1].detach().double().transpose(-1, -2))
        + rounded[2].detach().double()[:, None]
    )
    clear = ~(pre.abs() < 1e-5).any(-1)
    assert clear.float().mean() > 0.95
    got_grads = torch.autograd.grad(y, [a, w1, b1, w2], grad)
    want_grads = torch.autograd.grad(expected, [a, w1, b1, w2], grad)
    for got, want in zip([got_grads[0][clear], *got_grads[1:]], [want_grads[0][clear], *want_grads[1:]]):
        scale = want.abs().max().item()
        torch.testing.assert_close(got.float() / scale, want.float() / scale, **tolerance)


@pytest.mark.long  # every width of every kernel in Triton's interpreter; the kernels' equality stays default
def test_every_kernel_has_a_block_that_fits_a_gpus_shared_memory_at_every_width():
    """Each kernel's smallest candidate block, compiled for an H100 (sm_90; Triton compiles without
    a GPU), fits its shared memory at every D the op takes, in bf16 and in float32 (TF32 or IEEE
    products), so the autotuner always has one to run: a kernel with none would fail at a trial's
    first step. Found by a review: blocks of 64 rows x all of D in float32 needed up to 463 KB."""
    pytest.importorskip("triton")
    from trainables.models import feed_forward_triton as kernels
    from trainables.models.feed_forward_op import HIDDEN_BLOCK, WIDEST

    for tuned, (dtype, precision), d in itertools.product(
        (kernels._forward, kernels._backward_rows, kernels._backward_weights),
        [("bf16", "tf32"), ("fp32", "tf32"), ("fp32", "ieee")],
        (64, 128, 256, WIDEST),
    ):
        assert all(HIDDEN_BLOCK % config.kwargs["BF"] == 0 for config in tuned.configs)
        compiled = kernels.compile_for_sm90(tuned, tuned.configs[-1], dtype, d, precision)
        assert compiled.metadata.shared <= kernels.SHARED_MEMORY_LIMIT, (
            tuned.fn.__name__,
            dtype,
            precision,
            d,
            compiled.metadata.shared,
        )


def test_the_cpu_path_redraws_each_members_mask_in_its_backward():
    """Off CUDA the op draws member m's mask from a generator seeded with its seed, at its own rate;
    the backward draws the same mask, so its gradients are those of the forward it ran."""
    a, w1, b1, w2 = sublayer()
    rate, seed = torch.tensor([0.1, 0.5]), torch.tensor([3, 4])
    grad = torch.randn_like(a)
    y = feed_forward(a, w1, b1, w2, rate, seed)
    keep = keep_on_cpu(a.shape[1], w1.shape[1], rate, seed)
    expected = reference(a, w1, b1, w2, rate, keep)
    torch.testing.assert_close(y, expected)
    for got, want in zip(
        torch.autograd.grad(y, [a, w1, b1, w2], grad), torch.autograd.grad(expected, [a, w1, b1, w2], grad)
    ):
        torch.testing.assert_close(got, want)
    assert [round(m.float().mean().item(), 1) for m in keep] == [0.9, 0.5]
    assert not torch.equal(
        feed_forward(a, w1, b1, w2, rate, torch.tensor([5, 6])), y
    )  # other seeds, other masks


def step(cfg, members):
    """Every member's loss and every stacked parameter's gradient after one forward and backward."""
    torch.manual_seed(0)
    stack = Stack(cfg, members, load_task(cfg.task, cfg.task_options), torch.device("cpu"))
    _, losses = stack.forward_backward(stack.next_batch())
    return losses.detach(), {name: p.grad.clone() for name, p in stack.params.items()}


@pytest.mark.parametrize("model", ["ndr", "transformer"])
@pytest.mark.parametrize("compiled", [False, pytest.param(True, marks=pytest.mark.long)])
def test_a_stack_with_fused_feed_forwards_trains_as_the_stack_without(model, compiled):
    """Two members of their own learning rates, without dropout (the op draws its masks otherwise
    than torch): the same losses and gradients, vmapped and, compiled, with the op left whole."""
    members = [{"seed": 0, "lr": 1e-3}, {"seed": 1, "lr": 3e-3}]
    cfg = dict(compile=compiled, **NO_DROPOUT, **SIZES)
    losses, grads = step(tiny(model, **cfg), members)
    fused_losses, fused_grads = step(tiny(model, fused_feed_forward=True, **cfg), members)
    torch.testing.assert_close(fused_losses, losses)
    for name, grad in grads.items():
        torch.testing.assert_close(fused_grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)


def test_each_member_of_a_stack_drops_at_its_own_rate_through_the_op(monkeypatch):
    """Members of their own dropout: the op is handed each member's rate (and a seed of its own),
    forward and backward; the member at 0 trains as it does without the op, the one at 0.5 does not
    (the op draws its own masks)."""
    from trainables.models import feed_forward_op

    members = [{"seed": 0, "dropout": 0.0}, {"seed": 1, "dropout": 0.5}]
    losses, _ = step(tiny("ndr", query_dropout=0.0, **SIZES), members)
    drawn = []
    monkeypatch.setattr(
        feed_forward_op,
        "keep_on_cpu",
        lambda rows, hidden, rate, seed: (
            drawn.append((rate.tolist(), seed.tolist())) or keep_on_cpu(rows, hidden, rate, seed)
        ),
    )
    fused_losses, _ = step(tiny("ndr", query_dropout=0.0, fused_feed_forward=True, **SIZES), members)
    torch.testing.assert_close(fused_losses[0], losses[0])
    assert fused_losses[1] != losses[1]
    # two feed-forwards a layer step, each drawn in the forward and again in the backward
    assert len(drawn) == 2 * 2 * 2 and all(rate == [0.0, 0.5] for rate, _ in drawn)
    assert (
        all(len(set(seed)) == 2 for _, seed in drawn)
        and len({tuple(seed) for _, seed in drawn}) == len(drawn) // 2
    )


def test_evaluating_through_the_op_leaves_torchs_generator_where_it_was():
    """Dropout is off in evaluation, so the op needs no seed there; a drawn one would shift every
    later training step's masks by how often the trial was evaluated."""
    from trainables.models import feed_forward_op
    from trainables.models.transformer import FeedForward

    module, x = FeedForward(32, 64, 0.5, fused=True).eval(), torch.randn(3, 5, 32)
    before = torch.random.get_rng_state()
    feed_forward_op.apply(module, x)
    assert torch.equal(torch.random.get_rng_state(), before)
    module.train()
    feed_forward_op.apply(module, x)
    assert not torch.equal(torch.random.get_rng_state(), before)


def test_every_model_that_takes_the_key_runs_its_feed_forwards_through_the_op():
    """A key accepted and then ignored would train what the file did not ask for: where a model has
    no feed-forward of ours (the paper's set layer), the key is refused."""
    from test_train import TINY_BY_KIND

    from trainables.config import parse_trial_config
    from trainables.kinds import SET_REGRESSION
    from trainables.models import MODELS, build_model
    from trainables.models.configs import TransformerConfig
    from trainables.models.transformer import FeedForward

    for name, spec in MODELS.items():
        # the task kinds with a small task here; the image tasks' models are built of VQA's layers and Layer
        for kind in [k for k in spec.kinds if k in TINY_BY_KIND] if spec.config is TransformerConfig else ():
            task, options = TINY_BY_KIND[kind]
            cfg = parse_trial_config(
                {"task": task, "model": name, "task_options": options, "fused_feed_forward": True, **SIZES}
            )
            if kind is SET_REGRESSION and cfg.model_options.get("set_layer", "paper") == "paper":
                with pytest.raises(ValueError, match="no feed-forward of ours"):
                    build_model(name, cfg.model_options, load_task(task, options))
                continue
            model = build_model(name, cfg.model_options, load_task(task, options))
            feed_forwards = [m for m in model.modules() if isinstance(m, FeedForward)]
            assert feed_forwards and all(m.fused for m in feed_forwards), (name, kind)


def test_sizes_the_kernels_cannot_tile_are_refused_in_one_line():
    """A trial config is checked by building its model (on the meta device) before it trains."""
    from trainables.config import ConfigError, check_builds

    with pytest.raises(ConfigError, match="multiple of 64, got d_model=32, hidden=32"):
        check_builds(tiny("ndr", fused_feed_forward=True, d_model=32))
    with pytest.raises(ConfigError, match="from 16 to 512"):
        check_builds(tiny("ndr", fused_feed_forward=True, d_model=1024))


if __name__ == "__main__":
    in_the_interpreter()
