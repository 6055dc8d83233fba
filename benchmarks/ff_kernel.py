"""A feed-forward sublayer of NDR as Triton kernels of our own: the first kernel toward issue 21's
1,000 NDR member-steps/s, which `ops_per_step.py --fused` prices: 5.59 GB a member-step
compiled, 4.31 with the layer's elementwise work fused, 1.81 with each sublayer one kernel.

  y = dropout(relu(a W1^T + b1)) W2^T          (Eq. 5 with the paper's dropout; W2's bias is added
                                               by the next elementwise kernel, as fused_layer.py cuts)

for every member of a stack at once (weights [M, F, D] and [M, D, F], rows [M, T, D]). The hidden
layer [T, F] never reaches memory: the forward keeps a block of rows on chip through both
products; the backward recomputes it, its dropout mask redrawn from the same seed (Triton's
counter-based `tl.rand`), so nothing is saved but a, W1, b1, W2 and the seed.

  python benchmarks/ff_kernel.py [--members 1,20] [--rows 4096] [--steps 50]

On CUDA: the kernels against the same feed-forward in PyTorch, eager and compiled (forward and
backward, bf16, NDR's paper size: D 256, F 512, 512 x 8 tokens a member), their agreement and
their times. Without a GPU the kernels run in Triton's interpreter (TRITON_INTERPRET=1, slow,
numpy on the CPU), which the tests use to hold them equal to PyTorch's.
"""
from __future__ import annotations

import argparse
import os
import time

import torch
import triton
import triton.language as tl


@triton.jit
def _hidden(a, w1_ptr, b1_ptr, member, f0, seed, p, rows, row_mask, F, T,
            D: tl.constexpr, BF: tl.constexpr):
    """One block of hidden units for a block of rows: (pre-activation, kept and active mask,
    dropout(relu(pre)) in fp32)."""
    cols = f0 + tl.arange(0, BF)
    d = tl.arange(0, D)
    w1 = tl.load(w1_ptr + member * F * D + cols[:, None] * D + d[None, :])  # [BF, D]
    pre = tl.dot(a, tl.trans(w1)) + tl.load(b1_ptr + member * F + cols)[None, :].to(tl.float32)
    keep = tl.rand(seed, member * T * F + rows[:, None] * F + cols[None, :]) >= p
    live = keep & (pre > 0) & row_mask[:, None]
    return live, tl.where(live, pre / (1 - p), 0.0)


@triton.jit
def _forward(a_ptr, w1_ptr, b1_ptr, w2_ptr, y_ptr, seed, p, T, F,
             D: tl.constexpr, BM: tl.constexpr, BF: tl.constexpr):
    member, block = tl.program_id(1), tl.program_id(0)
    rows = block * BM + tl.arange(0, BM)
    row_mask = rows < T
    d = tl.arange(0, D)
    a = tl.load(a_ptr + member * T * D + rows[:, None] * D + d[None, :], mask=row_mask[:, None], other=0.0)
    y = tl.zeros((BM, D), dtype=tl.float32)
    for f0 in range(0, F, BF):
        _, hidden = _hidden(a, w1_ptr, b1_ptr, member, f0, seed, p, rows, row_mask, F, T, D, BF)
        cols = f0 + tl.arange(0, BF)
        w2 = tl.load(w2_ptr + member * D * F + d[:, None] * F + cols[None, :])  # [D, BF]
        y += tl.dot(hidden.to(w2.dtype), tl.trans(w2))
    tl.store(y_ptr + member * T * D + rows[:, None] * D + d[None, :], y.to(y_ptr.dtype.element_ty), mask=row_mask[:, None])


@triton.jit
def _backward_rows(g_ptr, a_ptr, w1_ptr, b1_ptr, w2_ptr, ga_ptr, seed, p, T, F,
                   D: tl.constexpr, BM: tl.constexpr, BF: tl.constexpr):
    """The gradient in a, a block of rows a program."""
    member, block = tl.program_id(1), tl.program_id(0)
    rows = block * BM + tl.arange(0, BM)
    row_mask = rows < T
    d = tl.arange(0, D)
    at = member * T * D + rows[:, None] * D + d[None, :]
    a = tl.load(a_ptr + at, mask=row_mask[:, None], other=0.0)
    g = tl.load(g_ptr + at, mask=row_mask[:, None], other=0.0)
    grad_a = tl.zeros((BM, D), dtype=tl.float32)
    for f0 in range(0, F, BF):
        live, _ = _hidden(a, w1_ptr, b1_ptr, member, f0, seed, p, rows, row_mask, F, T, D, BF)
        cols = f0 + tl.arange(0, BF)
        w2 = tl.load(w2_ptr + member * D * F + d[:, None] * F + cols[None, :])  # [D, BF]
        grad_pre = tl.where(live, tl.dot(g, w2) / (1 - p), 0.0)  # [BM, BF]
        w1 = tl.load(w1_ptr + member * F * D + cols[:, None] * D + d[None, :])  # [BF, D]
        grad_a += tl.dot(grad_pre.to(w1.dtype), w1)
    tl.store(ga_ptr + at, grad_a.to(ga_ptr.dtype.element_ty), mask=row_mask[:, None])


@triton.jit
def _backward_weights(g_ptr, a_ptr, w1_ptr, b1_ptr, w2_ptr, gw1_ptr, gb1_ptr, gw2_ptr, seed, p, T, F,
                      D: tl.constexpr, BM: tl.constexpr, BF: tl.constexpr):
    """The gradients in W1, b1 and W2 for a block of hidden units a program, summed over every row
    (no atomics: each program owns its block)."""
    member, chunk = tl.program_id(1), tl.program_id(0)
    f0 = chunk * BF
    cols = f0 + tl.arange(0, BF)
    d = tl.arange(0, D)
    w2 = tl.load(w2_ptr + member * D * F + d[:, None] * F + cols[None, :])  # [D, BF]
    grad_w1 = tl.zeros((BF, D), dtype=tl.float32)
    grad_w2 = tl.zeros((D, BF), dtype=tl.float32)
    grad_b1 = tl.zeros((BF,), dtype=tl.float32)
    for r0 in range(0, T, BM):
        rows = r0 + tl.arange(0, BM)
        row_mask = rows < T
        at = member * T * D + rows[:, None] * D + d[None, :]
        a = tl.load(a_ptr + at, mask=row_mask[:, None], other=0.0)
        g = tl.load(g_ptr + at, mask=row_mask[:, None], other=0.0)
        live, hidden = _hidden(a, w1_ptr, b1_ptr, member, f0, seed, p, rows, row_mask, F, T, D, BF)
        grad_pre = tl.where(live, tl.dot(g, w2) / (1 - p), 0.0)  # [BM, BF]
        grad_w2 += tl.dot(tl.trans(g), hidden.to(g.dtype))
        grad_w1 += tl.dot(tl.trans(grad_pre.to(a.dtype)), a)
        grad_b1 += tl.sum(grad_pre, axis=0)
    tl.store(gw1_ptr + member * F * D + cols[:, None] * D + d[None, :], grad_w1.to(gw1_ptr.dtype.element_ty))
    tl.store(gw2_ptr + member * D * F + d[:, None] * F + cols[None, :], grad_w2.to(gw2_ptr.dtype.element_ty))
    tl.store(gb1_ptr + member * F + cols, grad_b1.to(gb1_ptr.dtype.element_ty))


@triton.jit
def _keep(keep_ptr, seed, p, T, F, BF: tl.constexpr):
    """The dropout mask the kernels draw, written out: for tests against PyTorch."""
    member, row, chunk = tl.program_id(2), tl.program_id(0), tl.program_id(1)
    cols = chunk * BF + tl.arange(0, BF)
    at = member * T * F + row * F + cols
    tl.store(keep_ptr + at, (tl.rand(seed, at) >= p).to(tl.int8))


def kept(members: int, rows: int, hidden: int, p: float, seed: int, device) -> torch.Tensor:
    """[M, T, F] True where the kernels keep a hidden unit."""
    out = torch.empty(members, rows, hidden, dtype=torch.int8, device=device)
    _keep[(rows, hidden // BF, members)](out, seed, p, rows, hidden, BF=BF)
    return out.bool()


# Rows and hidden units a block. The weight gradients' block holds two fp32 accumulators of
# [D, BF_WEIGHTS]; narrower, so that at D 256 they stay in registers. Not tuned on a GPU yet.
BM, BF, BF_WEIGHTS, WARPS = 64, 64, 32, 8


class FeedForward(torch.autograd.Function):
    """a [M, T, D], w1 [M, F, D], b1 [M, F], w2 [M, D, F] (contiguous; a in the products' dtype,
    the weights cast to it) -> y [M, T, D]. Gradients in the weights come in the weights' dtype."""

    @staticmethod
    def forward(ctx, a, w1, b1, w2, p: float, seed: int):
        (members, rows, d), f = a.shape, w1.shape[1]
        if f % BF or d & (d - 1):
            raise ValueError(f"the hidden width must be a multiple of {BF} and d_model a power of 2, got F={f}, D={d}")
        ctx.save_for_backward(a, w1, b1, w2)
        ctx.p, ctx.seed, ctx.dtypes = p, seed, (w1.dtype, b1.dtype, w2.dtype)
        y = torch.empty_like(a)
        cast = [t.to(a.dtype).contiguous() for t in (w1, b1, w2)]
        _forward[(triton.cdiv(rows, BM), members)](a, cast[0], cast[1], cast[2], y, seed, p, rows, f, D=d, BM=BM, BF=BF,
                                                   num_warps=WARPS)
        return y

    @staticmethod
    def backward(ctx, grad):
        a, w1, b1, w2 = ctx.saved_tensors
        (members, rows, d), f = a.shape, w1.shape[1]
        w1c, b1c, w2c = (t.to(a.dtype).contiguous() for t in (w1, b1, w2))
        g = grad.to(a.dtype).contiguous()
        grad_a = torch.empty_like(a)
        grad_w1, grad_b1, grad_w2 = (torch.empty(t.shape, dtype=torch.float32, device=a.device) for t in (w1, b1, w2))
        _backward_rows[(triton.cdiv(rows, BM), members)](g, a, w1c, b1c, w2c, grad_a, ctx.seed, ctx.p, rows, f, D=d, BM=BM, BF=BF,
                                                         num_warps=WARPS)
        _backward_weights[(f // BF_WEIGHTS, members)](g, a, w1c, b1c, w2c, grad_w1, grad_b1, grad_w2, ctx.seed, ctx.p, rows, f,
                                                      D=d, BM=BM, BF=BF_WEIGHTS, num_warps=WARPS)
        return grad_a, grad_w1.to(ctx.dtypes[0]), grad_b1.to(ctx.dtypes[1]), grad_w2.to(ctx.dtypes[2]), None, None


def feed_forward(a, w1, b1, w2, p: float = 0.0, seed: int = 0):
    return FeedForward.apply(a, w1, b1, w2, p, seed)


def reference(a, w1, b1, w2, keep=None, p: float = 0.0):
    """The same in PyTorch (a mask of kept units given, or none dropped), in a's dtype as autocast
    computes Linear: products accumulated in fp32, rounded to a's dtype."""
    hidden = torch.relu(torch.matmul(a, w1.to(a.dtype).transpose(-1, -2)) + b1.to(a.dtype)[:, None])
    if keep is not None:
        hidden = hidden * keep / (1 - p)
    return torch.matmul(hidden.to(a.dtype), w2.to(a.dtype).transpose(-1, -2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--members", default="1,20")
    parser.add_argument("--rows", type=int, default=512 * 8, help="rows a member (batch x tokens)")
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--dropout", type=float, default=0.5)
    parser.add_argument("--steps", type=int, default=50)
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        raise SystemExit("ff_kernel.py: no GPU here; TRITON_INTERPRET=1 runs the kernels in Triton's interpreter (slowly, and bf16 wrongly)")
    compiled = torch.compile(reference) if device.type == "cuda" else None
    print(f"feed-forward D {args.d_model}, F {args.hidden}, {args.rows} rows a member, dropout {args.dropout}, bf16, on {device}")
    print(f"{'members':>7}  {'ours ms':>8}  {'eager ms':>8}  {'compiled ms':>11}  {'ours GB/s':>9}  max |ours - eager| (no dropout)")
    for members in (int(m) for m in args.members.split(",")):
        a = torch.randn(members, args.rows, args.d_model, device=device, dtype=torch.bfloat16, requires_grad=True)
        w1 = (torch.randn(members, args.hidden, args.d_model, device=device) / args.d_model ** 0.5).requires_grad_()
        b1 = torch.zeros(members, args.hidden, device=device, requires_grad=True)
        w2 = (torch.randn(members, args.d_model, args.hidden, device=device) / args.hidden ** 0.5).requires_grad_()
        difference = (feed_forward(a, w1, b1, w2) - reference(a, w1, b1, w2)).abs().max().item()
        keep = torch.rand(members, args.rows, args.hidden, device=device) >= args.dropout

        def timed(fn) -> float:
            for _ in range(3):
                fn().float().sum().backward()
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(args.steps):
                fn().float().sum().backward()
            if device.type == "cuda":
                torch.cuda.synchronize()
            return (time.perf_counter() - start) / args.steps * 1e3

        ours = timed(lambda: feed_forward(a, w1, b1, w2, args.dropout, seed=1))
        eager = timed(lambda: reference(a, w1, b1, w2, keep, args.dropout))
        fast = timed(lambda: compiled(a, w1, b1, w2, keep, args.dropout)) if compiled else float("nan")
        # what ours must move: a, y, grad y, grad a (bf16), the weights read twice and their gradients written (fp32)
        moved = members * (4 * args.rows * args.d_model * 2 + 3 * 2 * args.hidden * args.d_model * 4)
        print(f"{members:7d}  {ours:8.3f}  {eager:8.3f}  {fast:11.3f}  {moved / ours / 1e6:9.1f}  {difference:.3g}")


if __name__ == "__main__":
    main()
