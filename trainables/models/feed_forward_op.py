"""The feed-forward sublayer, y = dropout(relu(x W1^T + b1)) W2^T (+ b2, added after it), as one op
(`fused_feed_forward`, a layer's key): on CUDA Triton kernels of our own that keep the hidden
layer on chip and redraw its dropout mask in the backward (feed_forward_triton.py), elsewhere the
same in PyTorch.

Issue 21: Inductor's compiled NDR step moves 5.59 GB a member-step, which caps an H100 below the
issue's 1,000 member-steps/s. `benchmarks/ops_per_step.py --fused` prices kernels of our own: the
feed-forwards as such kernels (with the layer's elementwise work fused) bring it to 3.33 GB, every
sublayer to 1.81 (`benchmarks/fused_layer.py`). This is the first of them (3.86 GB with it). On
an H200 (2026-11-27) it computed what PyTorch does, but slower: NDR's compiled bf16 stack of 20
ran 257.8 member-steps/s with it against 441.2 without, its blocks then fixed and untimed (now
autotuned; `benchmarks/ff_kernel.py` times it against PyTorch's).

The op takes a stack's members at once (leading dim M; a single model is a stack of one): its
vmap rule hands it every member's rows, weights, dropout rate and seed, so a vmapped stack runs
one kernel launch per call, not one per member. Each call draws a seed per member from torch's
generator (graph-safe under CUDA graphs); the mask is a function of the seed and the unit's
index, so the backward draws it again. On the CPU the mask comes from a torch generator seeded
the same way: another mask than the GPU's for the same seed, the same distribution.
"""

from __future__ import annotations

import torch
from torch import Tensor

HIDDEN_BLOCK = 64  # a multiple of every kernel block's hidden units (feed_forward_triton's candidates)
WIDEST = 512  # the widest D whose smallest blocks fit a GPU's shared memory (feed_forward_triton)


def check_sizes(d: int, hidden: int) -> None:
    """The kernels hold all of D in a block (a power of two, at least tl.dot's 16) and tile the
    hidden layer in blocks."""
    if d & (d - 1) or not 16 <= d <= WIDEST or hidden % HIDDEN_BLOCK:
        raise ValueError(
            f"fused_feed_forward: d_model must be a power of two from 16 to {WIDEST} and the hidden width a "
            f"multiple of {HIDDEN_BLOCK}, got d_model={d}, hidden={hidden}"
        )


def keep_on_cpu(rows: int, hidden: int, rate: Tensor, seed: Tensor) -> Tensor:
    """[M, T, F] the mask the CPU path draws: member m's from a generator seeded with seed[m]."""
    masks = []
    for p, s in zip(rate.tolist(), seed.tolist()):
        generator = torch.Generator().manual_seed(int(s))
        masks.append(torch.rand(rows, hidden, generator=generator) >= p)
    return torch.stack(masks)


def reference(a: Tensor, w1: Tensor, b1: Tensor, w2: Tensor, rate: Tensor, keep: Tensor) -> Tensor:
    """The sublayer in PyTorch with a given mask [M, T, F], in a's dtype as autocast computes Linear."""
    hidden = torch.relu(torch.matmul(a, w1.to(a.dtype).transpose(-1, -2)) + b1.to(a.dtype)[:, None])
    hidden = hidden * keep.to(a.device) / (1 - rate.to(a.dtype))[:, None, None]
    return torch.matmul(hidden, w2.to(a.dtype).transpose(-1, -2))


@torch.library.custom_op("sysgen::feed_forward", mutates_args=())
def feed_forward(a: Tensor, w1: Tensor, b1: Tensor, w2: Tensor, rate: Tensor, seed: Tensor) -> Tensor:
    """a [M, T, D], w1 [M, F, D], b1 [M, F], w2 [M, D, F], rate and seed [M] -> [M, T, D] in a's dtype."""
    if a.is_cuda:
        from . import feed_forward_triton as kernels  # noqa: PLC0415 - triton: optional, CUDA only

        check_sizes(a.shape[-1], w1.shape[1])
        w1, b1, w2 = (t.to(a.dtype).contiguous() for t in (w1, b1, w2))
        return kernels.forward(a.contiguous(), w1, b1, w2, rate.float().contiguous(), seed.contiguous())
    return reference(a, w1, b1, w2, rate, keep_on_cpu(a.shape[1], w1.shape[1], rate, seed)).contiguous()


def _like(t: Tensor) -> Tensor:  # the ops' outputs are contiguous, whatever their inputs' strides
    return torch.empty(t.shape, dtype=t.dtype, device=t.device)


@feed_forward.register_fake
def _(a, w1, b1, w2, rate, seed):
    return _like(a)


@torch.library.custom_op("sysgen::feed_forward_backward", mutates_args=())
def feed_forward_backward(
    grad: Tensor, a: Tensor, w1: Tensor, b1: Tensor, w2: Tensor, rate: Tensor, seed: Tensor
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """-> the gradients in a (a's dtype) and in w1, b1, w2 (theirs)."""
    if a.is_cuda:
        from . import feed_forward_triton as kernels  # noqa: PLC0415 - triton: optional, CUDA only

        casts = [t.to(a.dtype).contiguous() for t in (w1, b1, w2)]
        grad_a, *grads = kernels.backward(
            grad.to(a.dtype).contiguous(),
            a.contiguous(),
            *casts,
            rate.float().contiguous(),
            seed.contiguous(),
        )
        return grad_a, *(g.to(t.dtype).contiguous() for g, t in zip(grads, (w1, b1, w2)))
    keep = keep_on_cpu(a.shape[1], w1.shape[1], rate, seed)
    # torch.func, not torch.autograd: an op's body runs below autograd's dispatch
    _, vjp = torch.func.vjp(lambda *args: reference(*args, rate, keep), a, w1, b1, w2)
    return tuple(g.contiguous().clone() for g in vjp(grad.to(a.dtype)))


@feed_forward_backward.register_fake
def _(grad, a, w1, b1, w2, rate, seed):
    return tuple(_like(t) for t in (a, w1, b1, w2))


def _setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _backward(ctx, grad):
    return (*feed_forward_backward(grad, *ctx.saved_tensors), None, None)


feed_forward.register_autograd(_backward, setup_context=_setup)


def _members(info, in_dims, *args):
    """Each argument with the stack's members first: the module calls the op with a member dim
    of one, which a vmapped stack's members fill."""
    out = []
    for t, d in zip(args, in_dims):
        out.append(
            t.movedim(d, 0).flatten(0, 1) if d is not None else t.expand(info.batch_size, *t.shape[1:])
        )
    return out


def _batched(info, in_dims, *args):
    return feed_forward(*_members(info, in_dims, *args))[:, None], 0


torch.library.register_vmap(feed_forward, _batched)


def apply(module, x: Tensor) -> Tensor:
    """module: a FeedForward (Linear, ReLU, Dropout, Linear), x [..., D] -> module(x) through the op."""
    first, _, dropout, second = module
    device = x.device.type
    if torch.is_autocast_enabled(device):  # as Linear takes its input under autocast
        x = x.to(torch.get_autocast_dtype(device))
    # the rate buffer: each member's own in a stack (dropout.py), the module's p otherwise
    rate = dropout.rate.float() if module.training else torch.zeros_like(dropout.rate, dtype=torch.float32)
    # drawn only in training: an evaluation that drew from torch's generator would move every later
    # training step's masks, so a trial's curve would depend on how often it is evaluated
    seed = (
        torch.randint(0, 2**31 - 1, (1,), device=x.device)
        if module.training
        else torch.zeros(1, dtype=torch.int64, device=x.device)
    )
    rows = x.reshape(1, -1, x.shape[-1])
    y = feed_forward(rows, first.weight[None], first.bias[None], second.weight[None], rate.reshape(1), seed)
    return y.reshape(x.shape) + second.bias.to(y.dtype)
