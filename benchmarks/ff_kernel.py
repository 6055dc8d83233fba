"""The feed-forward sublayer as our Triton kernels (trainables/models/feed_forward_op.py, a layer's
`fused_feed_forward`) against the same sublayer in PyTorch, eager and compiled: forward and
backward, bf16, NDR's paper size (D 256, F 512, 512 x 8 tokens a member), a stack's members at once.

  python benchmarks/ff_kernel.py [--members 1,20] [--rows 4096] [--steps 50] [--sweep]

Needs CUDA. Prints each one's milliseconds per forward and backward, the bytes ours must move
over its time, and how far ours is from PyTorch's without dropout. --sweep instead prints how the
autotuner timed each of our three kernels' candidate blocks (feed_forward_triton.FORWARD, ...),
fastest first.
"""

from __future__ import annotations

import argparse
import collections
import re
import time

import torch

from trainables.models.feed_forward_op import feed_forward, reference


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--members", default="1,20")
    parser.add_argument("--rows", type=int, default=512 * 8, help="rows a member (batch x tokens)")
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--dropout", type=float, default=0.5)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--sweep", action="store_true", help="the autotuner's timing of each kernel's blocks")
    parser.add_argument(
        "--ptx", action="store_true", help="each kernel's instructions, compiled for sm_90 (no GPU needed)"
    )
    args = parser.parse_args()
    if args.ptx:
        return instructions(args.d_model)
    if not torch.cuda.is_available():
        raise SystemExit(
            "ff_kernel.py: needs CUDA but for --ptx (tests/test_feed_forward_op.py runs the "
            "kernels in Triton's interpreter)"
        )
    if args.sweep:
        for members in (int(m) for m in args.members.split(",")):
            sweep(members, args.rows, args.d_model, args.hidden, args.dropout)
        return
    device = torch.device("cuda")
    compiled = torch.compile(reference)
    print(
        f"feed-forward D {args.d_model}, F {args.hidden}, {args.rows} rows a member, dropout {args.dropout}, "
        f"bf16, {torch.cuda.get_device_name()}"
    )
    print(
        f"{'members':>7}  {'ours ms':>8}  {'eager ms':>8}  {'compiled ms':>11}  {'ours GB/s':>9}  "
        "max |ours - eager| / max |eager| (no dropout): y, then the gradients in a, w1, b1, w2"
    )
    for members in (int(m) for m in args.members.split(",")):
        a, w1, b1, w2 = sublayer(members, args.rows, args.d_model, args.hidden)
        seed = torch.randint(0, 2**31 - 1, (members,), device=device)
        off, rate = torch.zeros(members, device=device), torch.full((members,), args.dropout, device=device)
        keep = torch.rand(members, args.rows, args.hidden, device=device) >= args.dropout
        eager = reference(a, w1, b1, w2, off, torch.ones_like(keep))
        ours = feed_forward(a, w1, b1, w2, off, seed)
        grad = torch.randn_like(eager)
        pairs = [
            (ours, eager),
            *zip(
                torch.autograd.grad(ours, [a, w1, b1, w2], grad),
                torch.autograd.grad(eager, [a, w1, b1, w2], grad),
            ),
        ]
        errors = ", ".join(
            f"{((x.float() - y.float()).abs().max() / y.float().abs().max()).item():.2g}" for x, y in pairs
        )

        def timed(fn) -> float:
            for _ in range(3):
                fn().float().sum().backward()
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(args.steps):
                fn().float().sum().backward()
            torch.cuda.synchronize()
            return (time.perf_counter() - start) / args.steps * 1e3

        ours_ms = timed(lambda: feed_forward(a, w1, b1, w2, rate, seed))
        eager_ms = timed(lambda: reference(a, w1, b1, w2, rate, keep))
        compiled_ms = timed(lambda: compiled(a, w1, b1, w2, rate, keep))
        # what ours must move: a, y, grad y, grad a (bf16), the weights read three times and their
        # gradients written (fp32)
        moved = members * (4 * args.rows * args.d_model * 2 + 4 * 2 * args.hidden * args.d_model * 4)
        print(
            f"{members:7d}  {ours_ms:8.3f}  {eager_ms:8.3f}  {compiled_ms:11.3f}  "
            f"{moved / ours_ms / 1e6:9.1f}  {errors}"
        )


def sublayer(members: int, rows: int, d: int, hidden: int) -> tuple[torch.Tensor, ...]:
    """A stack's rows (bf16) and feed-forward weights (float32, as a stack's parameters) on CUDA."""
    device = torch.device("cuda")
    a = torch.randn(members, rows, d, device=device, dtype=torch.bfloat16, requires_grad=True)
    w1 = (torch.randn(members, hidden, d, device=device) / d**0.5).requires_grad_()
    b1 = torch.zeros(members, hidden, device=device, requires_grad=True)
    w2 = (torch.randn(members, d, hidden, device=device) / hidden**0.5).requires_grad_()
    return a, w1, b1, w2


def instructions(d: int) -> None:
    """PTX instructions of each kernel's first (fastest measured) block, bf16: all, the dropout
    draw's (Philox: mul.hi, mul.lo, xor) and the matrix products' (wgmma)."""
    from trainables.models import feed_forward_triton as kernels  # noqa: PLC0415 - Triton: --ptx and --sweep only

    print(
        f"PTX of each kernel's loop as compiled for sm_90, bf16, D {d} (a static count: the loop body once)"
    )
    print(f"{'kernel':<17} {'block':<26} {'all':>6} {'philox':>7} {'wgmma':>6}")
    for tuned in (kernels._forward, kernels._backward_rows, kernels._backward_weights):
        config = tuned.configs[0]
        ptx = kernels.compile_for_sm90(tuned, config, "bf16", d).asm["ptx"]
        ops = collections.Counter(
            m.group(1) for m in re.finditer(r"^\s+(?:@!?%p\d+\s+)?([a-z][\w.]*)", ptx, re.M)
        )
        philox = sum(n for op, n in ops.items() if op.startswith(("mul.hi", "mul.lo", "xor")))
        products = sum(n for op, n in ops.items() if op.startswith("wgmma.mma_async"))
        block = (
            " ".join(f"{k} {v}" for k, v in config.kwargs.items())
            + f" w{config.num_warps} s{config.num_stages}"
        )
        print(f"{tuned.fn.__name__:<17} {block:<26} {sum(ops.values()):6d} {philox:7d} {products:6d}")


def sweep(members: int, rows: int, d: int, hidden: int, dropout: float) -> None:
    """One forward and backward of the op, then the autotuner's timing of each candidate block."""
    from trainables.models import feed_forward_triton as kernels  # noqa: PLC0415 - Triton: --ptx and --sweep only

    device = torch.device("cuda")
    a, w1, b1, w2 = sublayer(members, rows, d, hidden)
    rate, seed = torch.full((members,), dropout, device=device), torch.arange(members, device=device)
    feed_forward(a, w1, b1, w2, rate, seed).float().sum().backward()
    for name in ("forward", "backward_rows", "backward_weights"):
        tuned = getattr(kernels, "_" + name)
        # configs_timings: [median, 20th, 80th percentile] ms a block, inf where it did not fit
        timings = sorted((ms[0], str(config)) for config, ms in getattr(tuned, "configs_timings", {}).items())
        print(
            f"{members} members, {name} ({len(timings)} blocks, "
            f"{sum(ms == float('inf') for ms, _ in timings)} too large): "
            + "; ".join(f"{ms:.3f} ms {config}" for ms, config in timings),
            flush=True,
        )


if __name__ == "__main__":
    main()
