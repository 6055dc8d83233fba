"""Triton kernels of the feed-forward sublayer, y = dropout(relu(a W1^T + b1)) W2^T, for every member
of a stack at once (feed_forward_op.py is the op around them; imported only where they run).

The hidden layer [rows, F] never reaches memory: the forward keeps a block of rows on chip
through both products; the backward recomputes it, its dropout mask redrawn from the member's
seed (Triton's counter-based tl.rand of the unit's index), so nothing is kept but the inputs.
Shapes: a [M, T, D] (the products' dtype), w1 [M, F, D], b1 [M, F], w2 [M, D, F] (cast to a's
dtype), rate and seed [M]; D a power of two, F a multiple of BF.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

# Rows and hidden units a block. The weight gradients' block holds two fp32 accumulators of
# [D, BF_WEIGHTS]; narrower, so that at D 256 they stay in registers. Not tuned on a GPU yet.
BM, BF, BF_WEIGHTS, WARPS = 64, 64, 32, 8  # BF: feed_forward_op.HIDDEN_BLOCK, which the op checks
PROGRAMS_WANTED = 256  # about two a streaming multiprocessor of an H100 (132) or H200


@triton.jit
def _hidden(a, w1_ptr, b1_ptr, member, f0, seed, p, rows, row_mask, F, T,
            D: tl.constexpr, BF: tl.constexpr):
    """One block of hidden units for a block of rows: (kept and active, dropout(relu(pre)) in fp32)."""
    cols = f0 + tl.arange(0, BF)
    d = tl.arange(0, D)
    w1 = tl.load(w1_ptr + member * F * D + cols[:, None] * D + d[None, :])  # [BF, D]
    pre = tl.dot(a, tl.trans(w1)) + tl.load(b1_ptr + member * F + cols)[None, :].to(tl.float32)
    keep = tl.rand(seed, rows[:, None] * F + cols[None, :]) >= p
    live = keep & (pre > 0) & row_mask[:, None]
    return live, tl.where(live, pre / (1 - p), 0.0)


@triton.jit
def _forward(a_ptr, w1_ptr, b1_ptr, w2_ptr, rate_ptr, seed_ptr, y_ptr, T, F,
             D: tl.constexpr, BM: tl.constexpr, BF: tl.constexpr):
    member, block = tl.program_id(1).to(tl.int64), tl.program_id(0)  # int64: a large stack's offsets may pass 2**31
    seed, p = tl.load(seed_ptr + member), tl.load(rate_ptr + member)
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
def _backward_rows(g_ptr, a_ptr, w1_ptr, b1_ptr, w2_ptr, rate_ptr, seed_ptr, ga_ptr, T, F,
                   D: tl.constexpr, BM: tl.constexpr, BF: tl.constexpr):
    """The gradient in a, a block of rows a program."""
    member, block = tl.program_id(1).to(tl.int64), tl.program_id(0)  # int64: a large stack's offsets may pass 2**31
    seed, p = tl.load(seed_ptr + member), tl.load(rate_ptr + member)
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
def _backward_weights(g_ptr, a_ptr, w1_ptr, b1_ptr, w2_ptr, rate_ptr, seed_ptr, gw1_ptr, gb1_ptr, gw2_ptr, T, F, rows_each,
                      D: tl.constexpr, BM: tl.constexpr, BF: tl.constexpr, SHARED: tl.constexpr):
    """The gradients in W1, b1 and W2 for a block of hidden units a program, summed over its share
    of the rows: all of them, stored; or, SHARED, one of several shares added into zeroed
    gradients (a small stack, whose blocks alone would leave most of the GPU idle)."""
    chunk, share, member = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    seed, p = tl.load(seed_ptr + member), tl.load(rate_ptr + member)
    f0 = chunk * BF
    cols = f0 + tl.arange(0, BF)
    d = tl.arange(0, D)
    w2 = tl.load(w2_ptr + member * D * F + d[:, None] * F + cols[None, :])  # [D, BF]
    grad_w1 = tl.zeros((BF, D), dtype=tl.float32)
    grad_w2 = tl.zeros((D, BF), dtype=tl.float32)
    grad_b1 = tl.zeros((BF,), dtype=tl.float32)
    for r0 in range(share * rows_each, tl.minimum((share + 1) * rows_each, T), BM):
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
    at_w1, at_w2, at_b1 = member * F * D + cols[:, None] * D + d[None, :], member * D * F + d[:, None] * F + cols[None, :], member * F + cols
    if not SHARED:
        tl.store(gw1_ptr + at_w1, grad_w1)
        tl.store(gw2_ptr + at_w2, grad_w2)
        tl.store(gb1_ptr + at_b1, grad_b1)
    else:
        tl.atomic_add(gw1_ptr + at_w1, grad_w1)
        tl.atomic_add(gw2_ptr + at_w2, grad_w2)
        tl.atomic_add(gb1_ptr + at_b1, grad_b1)


@triton.jit
def _keep(keep_ptr, seed_ptr, rate_ptr, T, F, BF: tl.constexpr):
    """The dropout mask the kernels draw, written out: for tests against PyTorch."""
    member, row, chunk = tl.program_id(2).to(tl.int64), tl.program_id(0), tl.program_id(1)
    cols = chunk * BF + tl.arange(0, BF)
    keep = tl.rand(tl.load(seed_ptr + member), row * F + cols) >= tl.load(rate_ptr + member)
    tl.store(keep_ptr + member * T * F + row * F + cols, keep.to(tl.int8))


def forward(a, w1, b1, w2, rate, seed):
    (members, rows, d), f = a.shape, w1.shape[1]
    y = torch.empty_like(a)
    _forward[(triton.cdiv(rows, BM), members)](a, w1, b1, w2, rate, seed, y, rows, f, D=d, BM=BM, BF=BF, num_warps=WARPS)
    return y


def row_shares(members: int, hidden: int, rows: int) -> int:
    """How many programs share a weight block's rows: enough blocks to give each of about
    PROGRAMS_WANTED a program, in shares of whole row blocks."""
    blocks = members * (hidden // BF_WEIGHTS)
    return max(1, min(PROGRAMS_WANTED // blocks, triton.cdiv(rows, BM)))


def backward(grad, a, w1, b1, w2, rate, seed, split: int | None = None):
    """-> the gradients in a (a's dtype) and in w1, b1, w2 (fp32). `split`: row shares of the
    weight gradients (default row_shares)."""
    (members, rows, d), f = a.shape, w1.shape[1]
    split = split or row_shares(members, f, rows)
    grad_a = torch.empty_like(a)
    grad_w1, grad_b1, grad_w2 = ((torch.zeros if split > 1 else torch.empty)(t.shape, dtype=torch.float32, device=a.device)
                                 for t in (w1, b1, w2))
    _backward_rows[(triton.cdiv(rows, BM), members)](grad, a, w1, b1, w2, rate, seed, grad_a, rows, f,
                                                     D=d, BM=BM, BF=BF, num_warps=WARPS)
    rows_each = triton.cdiv(triton.cdiv(rows, BM), split) * BM
    _backward_weights[(f // BF_WEIGHTS, split, members)](grad, a, w1, b1, w2, rate, seed, grad_w1, grad_b1, grad_w2, rows, f,
                                                         rows_each, D=d, BM=BM, BF=BF_WEIGHTS, SHARED=split > 1, num_warps=WARPS)
    return grad_a, grad_w1, grad_b1, grad_w2


def kept(rows: int, hidden: int, rate, seed) -> torch.Tensor:
    """[M, T, F] True where the kernels keep a hidden unit of member m's rows."""
    out = torch.empty(len(seed), rows, hidden, dtype=torch.int8, device=seed.device)
    _keep[(rows, hidden // BF, len(seed))](out, seed, rate, rows, hidden, BF=BF)
    return out.bool()
