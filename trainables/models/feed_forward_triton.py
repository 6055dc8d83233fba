"""Triton kernels of the feed-forward sublayer, y = dropout(relu(a W1^T + b1)) W2^T, for every member
of a stack at once (feed_forward_op.py is the op around them; imported only where they run).

The hidden layer [rows, F] never reaches memory: the forward keeps a block of rows on chip
through both products; the backward recomputes it, its dropout mask redrawn from the member's
seed (_kept: Philox of the unit's index), so nothing is kept but the inputs.
Shapes: a [M, T, D] (the products' dtype), w1 [M, F, D], b1 [M, F], w2 [M, D, F] (cast to a's
dtype), rate and seed [M]; D a power of two from 16 to 512, F a multiple of 64; within a member,
offsets are 32-bit (T x F below 2**31: four million rows at F 512).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

# The blocks each kernel may take, (rows BM, hidden units BF, pipeline stages, warps[, row shares
# SPLIT]): Triton's autotuner times them at a stack's first call (per member count, D, F and dtype)
# and keeps the fastest; those that do not fit the GPU's shared memory are passed over (a block
# holds all of D, so float32 and D 512 need the small ones; and the same block took 262,144 bytes
# under triton 3.6 against 3.9's fit under 232,448). The forward's and backward_rows' first two
# were the fastest at NDR's size (20 members of 4,096 rows, D 256, F 512, bf16) on an H200
# (benchmarks/ff_kernel.py --sweep, 2026-11-27; backward_weights was not reached); the others
# cover float32, D 512 (each list's last fits them all) and small stacks. Every BF divides 64
# (feed_forward_op.HIDDEN_BLOCK).
FORWARD = [
    (64, 32, 2, 4),
    (128, 64, 2, 8),
    (128, 32, 3, 8),
    (64, 64, 3, 8),
    (32, 32, 2, 4),
    (32, 32, 2, 8),
    (16, 32, 1, 4),
]
BACKWARD_ROWS = [
    (128, 32, 3, 8),
    (128, 32, 2, 8),
    (64, 64, 2, 4),
    (64, 32, 3, 4),
    (64, 64, 3, 8),
    (32, 32, 2, 4),
    (16, 32, 1, 8),
]
# SPLIT > 1: several programs share a block's rows, adding into zeroed gradients, so that a small
# stack (whose hidden blocks alone are a few dozen programs) does not leave most of the GPU idle.
BACKWARD_WEIGHTS = [
    (64, 32, 3, 8, 1),
    (64, 32, 2, 4, 1),
    (128, 32, 2, 8, 1),
    (64, 64, 2, 8, 1),
    (64, 32, 3, 8, 2),
    (64, 32, 3, 8, 4),
    (64, 32, 3, 8, 16),
    (32, 32, 2, 4, 4),
    (16, 16, 1, 4, 1),
    (16, 16, 1, 4, 16),
]
SHARED_MEMORY_LIMIT = 232_448  # bytes a block may use on sm_90 (an H100's or H200's)
# The kernels take the member count M only for this key. Not T: a batch's rows vary a little, and
# each new key is timed again.
TUNED_BY = ["M", "D", "F"]


def configs(blocks: list[tuple]) -> list[triton.Config]:
    return [
        triton.Config(dict(zip(("BM", "BF", "SPLIT"), (bm, bf, *split))), num_stages=stages, num_warps=warps)
        for bm, bf, stages, warps, *split in blocks
    ]


def precision(a: torch.Tensor) -> str:
    """tl.dot's: float32 products as torch's matmuls are set (tf32: false means IEEE float32)."""
    return "tf32" if a.dtype != torch.float32 or torch.backends.cuda.matmul.allow_tf32 else "ieee"


@triton.jit
def _kept(seed, p, rows, f0, F, BM: tl.constexpr, BF: tl.constexpr):
    """[BM, BF] True where hidden units f0.. of `rows` are kept. One Philox draw (10 rounds of
    32-bit products, as costly as the block's matrix products when drawn a unit at a time, as
    tl.rand does) gives four numbers: four neighbouring units' (the unit's index // 4 the draw's
    counter, % 4 which of its numbers), whatever a kernel's BF."""
    r0, r1, r2, r3 = tl.randint4x(seed, rows[:, None] * (F // 4) + (f0 // 4 + tl.arange(0, BF // 4))[None, :])
    # [.., j, k, h] = r_{2k+h}: unit 4j + 2k + h
    numbers = tl.reshape(tl.join(tl.join(r0, r2), tl.join(r1, r3)), (BM, BF))
    return tl.uint_to_uniform_float(numbers) >= p


@triton.jit
def _hidden(
    a,
    w1_ptr,
    b1_ptr,
    member,
    f0,
    seed,
    p,
    rows,
    row_mask,
    F,
    D: tl.constexpr,
    BM: tl.constexpr,
    BF: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """One block of hidden units for a block of rows: (kept and active, dropout(relu(pre)) in fp32)."""
    cols = f0 + tl.arange(0, BF)
    d = tl.arange(0, D)
    w1 = tl.load(w1_ptr + member * F * D + cols[:, None] * D + d[None, :])  # [BF, D]
    pre = tl.dot(a, tl.trans(w1), input_precision=PRECISION) + tl.load(b1_ptr + member * F + cols)[
        None, :
    ].to(tl.float32)
    live = _kept(seed, p, rows, f0, F, BM, BF) & (pre > 0) & row_mask[:, None]
    return live, tl.where(live, pre / (1 - p), 0.0)


@triton.jit
def _row_block(a_ptr, rate_ptr, seed_ptr, T, D: tl.constexpr, BM: tl.constexpr):
    """A program's member and block of rows (grid: row blocks, members): (member, its seed and rate,
    the rows, which of them exist, the offsets of their [BM, D] elements, a there)."""
    # int64: a large stack's offsets may pass 2**31
    member, block = tl.program_id(1).to(tl.int64), tl.program_id(0)
    rows = block * BM + tl.arange(0, BM)
    row_mask = rows < T
    at = member * T * D + rows[:, None] * D + tl.arange(0, D)[None, :]
    a = tl.load(a_ptr + at, mask=row_mask[:, None], other=0.0)
    return member, tl.load(seed_ptr + member), tl.load(rate_ptr + member), rows, row_mask, at, a


@triton.autotune(configs(FORWARD), key=TUNED_BY)
@triton.jit
def _forward(
    a_ptr,
    w1_ptr,
    b1_ptr,
    w2_ptr,
    rate_ptr,
    seed_ptr,
    y_ptr,
    M,
    T,
    F,
    D: tl.constexpr,
    BM: tl.constexpr,
    BF: tl.constexpr,
    PRECISION: tl.constexpr,
):
    member, seed, p, rows, row_mask, at, a = _row_block(a_ptr, rate_ptr, seed_ptr, T, D, BM)
    d = tl.arange(0, D)
    y = tl.zeros((BM, D), dtype=tl.float32)
    for f0 in range(0, F, BF):
        _, hidden = _hidden(a, w1_ptr, b1_ptr, member, f0, seed, p, rows, row_mask, F, D, BM, BF, PRECISION)
        cols = f0 + tl.arange(0, BF)
        w2 = tl.load(w2_ptr + member * D * F + d[:, None] * F + cols[None, :])  # [D, BF]
        y += tl.dot(hidden.to(w2.dtype), tl.trans(w2), input_precision=PRECISION)
    tl.store(y_ptr + at, y.to(y_ptr.dtype.element_ty), mask=row_mask[:, None])


@triton.autotune(configs(BACKWARD_ROWS), key=TUNED_BY)
@triton.jit
def _backward_rows(
    g_ptr,
    a_ptr,
    w1_ptr,
    b1_ptr,
    w2_ptr,
    rate_ptr,
    seed_ptr,
    ga_ptr,
    M,
    T,
    F,
    D: tl.constexpr,
    BM: tl.constexpr,
    BF: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """The gradient in a, a block of rows a program."""
    member, seed, p, rows, row_mask, at, a = _row_block(a_ptr, rate_ptr, seed_ptr, T, D, BM)
    d = tl.arange(0, D)
    g = tl.load(g_ptr + at, mask=row_mask[:, None], other=0.0)
    grad_a = tl.zeros((BM, D), dtype=tl.float32)
    for f0 in range(0, F, BF):
        live, _ = _hidden(a, w1_ptr, b1_ptr, member, f0, seed, p, rows, row_mask, F, D, BM, BF, PRECISION)
        cols = f0 + tl.arange(0, BF)
        w2 = tl.load(w2_ptr + member * D * F + d[:, None] * F + cols[None, :])  # [D, BF]
        grad_pre = tl.where(live, tl.dot(g, w2, input_precision=PRECISION) / (1 - p), 0.0)  # [BM, BF]
        w1 = tl.load(w1_ptr + member * F * D + cols[:, None] * D + d[None, :])  # [BF, D]
        grad_a += tl.dot(grad_pre.to(w1.dtype), w1, input_precision=PRECISION)
    tl.store(ga_ptr + at, grad_a.to(ga_ptr.dtype.element_ty), mask=row_mask[:, None])


@triton.autotune(configs(BACKWARD_WEIGHTS), key=TUNED_BY, reset_to_zero=["gw1_ptr", "gb1_ptr", "gw2_ptr"])
@triton.jit
def _backward_weights(
    g_ptr,
    a_ptr,
    w1_ptr,
    b1_ptr,
    w2_ptr,
    rate_ptr,
    seed_ptr,
    gw1_ptr,
    gb1_ptr,
    gw2_ptr,
    M,
    T,
    F,
    D: tl.constexpr,
    BM: tl.constexpr,
    BF: tl.constexpr,
    SPLIT: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """The gradients in W1, b1 and W2 for a block of hidden units a program, summed over its share
    of the rows: all of them, stored; or, SPLIT > 1, one of SPLIT shares added into zeroed
    gradients."""
    chunk, share, member = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    seed, p = tl.load(seed_ptr + member), tl.load(rate_ptr + member)
    f0 = chunk * BF
    cols = f0 + tl.arange(0, BF)
    d = tl.arange(0, D)
    w2 = tl.load(w2_ptr + member * D * F + d[:, None] * F + cols[None, :])  # [D, BF]
    grad_w1 = tl.zeros((BF, D), dtype=tl.float32)
    grad_w2 = tl.zeros((D, BF), dtype=tl.float32)
    grad_b1 = tl.zeros((BF,), dtype=tl.float32)
    rows_each = tl.cdiv(tl.cdiv(T, BM), SPLIT) * BM
    for r0 in range(share * rows_each, tl.minimum((share + 1) * rows_each, T), BM):
        rows = r0 + tl.arange(0, BM)
        row_mask = rows < T
        at = member * T * D + rows[:, None] * D + d[None, :]
        a = tl.load(a_ptr + at, mask=row_mask[:, None], other=0.0)
        g = tl.load(g_ptr + at, mask=row_mask[:, None], other=0.0)
        live, hidden = _hidden(
            a, w1_ptr, b1_ptr, member, f0, seed, p, rows, row_mask, F, D, BM, BF, PRECISION
        )
        grad_pre = tl.where(live, tl.dot(g, w2, input_precision=PRECISION) / (1 - p), 0.0)  # [BM, BF]
        grad_w2 += tl.dot(tl.trans(g), hidden.to(g.dtype), input_precision=PRECISION)
        grad_w1 += tl.dot(tl.trans(grad_pre.to(a.dtype)), a, input_precision=PRECISION)
        grad_b1 += tl.sum(grad_pre, axis=0)
    at_w1, at_w2, at_b1 = (
        member * F * D + cols[:, None] * D + d[None, :],
        member * D * F + d[:, None] * F + cols[None, :],
        member * F + cols,
    )
    if SPLIT == 1:
        tl.store(gw1_ptr + at_w1, grad_w1)
        tl.store(gw2_ptr + at_w2, grad_w2)
        tl.store(gb1_ptr + at_b1, grad_b1)
    else:
        tl.atomic_add(gw1_ptr + at_w1, grad_w1)
        tl.atomic_add(gw2_ptr + at_w2, grad_w2)
        tl.atomic_add(gb1_ptr + at_b1, grad_b1)


@triton.jit
def _write_kept(keep_ptr, seed_ptr, rate_ptr, T, F, BM: tl.constexpr, BF: tl.constexpr):
    """The dropout mask the kernels draw, written out: for tests against PyTorch."""
    member, f0 = tl.program_id(2).to(tl.int64), tl.program_id(1) * BF
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    keep = _kept(tl.load(seed_ptr + member), tl.load(rate_ptr + member), rows, f0, F, BM, BF)
    at = member * T * F + rows[:, None] * F + (f0 + tl.arange(0, BF))[None, :]
    tl.store(keep_ptr + at, keep.to(tl.int8), mask=(rows < T)[:, None])


def forward(a, w1, b1, w2, rate, seed):
    (members, rows, d), f = a.shape, w1.shape[1]
    y = torch.empty_like(a)
    _forward[lambda meta: (triton.cdiv(rows, meta["BM"]), members)](
        a, w1, b1, w2, rate, seed, y, members, rows, f, D=d, PRECISION=precision(a)
    )
    return y


def backward(grad, a, w1, b1, w2, rate, seed):
    """-> the gradients in a (a's dtype) and in w1, b1, w2 (fp32)."""
    (members, rows, d), f = a.shape, w1.shape[1]
    grad_a = torch.empty_like(a)
    _backward_rows[lambda meta: (triton.cdiv(rows, meta["BM"]), members)](
        grad, a, w1, b1, w2, rate, seed, grad_a, members, rows, f, D=d, PRECISION=precision(a)
    )
    grad_w1, grad_b1, grad_w2 = (
        torch.zeros(t.shape, dtype=torch.float32, device=a.device) for t in (w1, b1, w2)
    )
    _backward_weights[lambda meta: (f // meta["BF"], meta["SPLIT"], members)](
        grad,
        a,
        w1,
        b1,
        w2,
        rate,
        seed,
        grad_w1,
        grad_b1,
        grad_w2,
        members,
        rows,
        f,
        D=d,
        PRECISION=precision(a),
    )
    return grad_a, grad_w1, grad_b1, grad_w2


def compile_for_sm90(tuned, config: triton.Config, dtype: str, d: int, precision: str = "tf32"):
    """`tuned` (one of the autotuned kernels) in block `config`, compiled for an H100 or H200
    without one (dtype "bf16" or "fp32"), as a launch would specialize it: pointers and the row
    and hidden counts divisible by 16. Its .metadata.shared and .asm["ptx"] are what it would run."""
    kernel = tuned.fn
    signature = {arg: f"*{dtype}" if arg.endswith("_ptr") else "i32" for arg in kernel.arg_names}
    signature.update(
        {"rate_ptr": "*fp32", "seed_ptr": "*i64"},
        **{g: "*fp32" for g in ("gw1_ptr", "gb1_ptr", "gw2_ptr") if g in signature},
    )
    constants = {k: v for k, v in {"D": d, "PRECISION": precision, **config.kwargs}.items() if k in signature}
    signature.update({k: "constexpr" for k in constants})
    divisible = {
        (i,): [["tt.divisibility", 16]]
        for i, arg in enumerate(kernel.arg_names)
        if arg.endswith("_ptr") or arg in ("T", "F")
    }
    return triton.compile(
        ASTSource(kernel, signature, constexprs=constants, attrs=divisible),
        target=GPUTarget("cuda", 90, 32),
        options={"num_warps": config.num_warps, "num_stages": config.num_stages},
    )


def kept(rows: int, hidden: int, rate, seed) -> torch.Tensor:
    """[M, T, F] True where the kernels keep a hidden unit of member m's rows."""
    out = torch.empty(len(seed), rows, hidden, dtype=torch.int8, device=seed.device)
    _write_kept[(triton.cdiv(rows, 16), hidden // 64, len(seed))](out, seed, rate, rows, hidden, BM=16, BF=64)
    return out.bool()
