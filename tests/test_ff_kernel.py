"""benchmarks/ff_kernel.py: NDR's feed-forward sublayer as Triton kernels, in Triton's interpreter
(no GPU here), against the same feed-forward in PyTorch. Each check runs in a process of its own:
the interpreter must be switched on before triton is first imported (its own library's
functions are built then), and torch imports triton early. In float32: the interpreter's tl.dot
multiplies bf16 tiles wrongly (a 16 x 16 product of its own is off by 1e10), so bf16 is checked
on a GPU, by the benchmark."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def in_the_interpreter(check: str, *args: str) -> None:
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": os.pathsep.join([str(BENCHMARKS), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, __file__, check, *args], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.parametrize("p", ["0.0", "0.4"])
def test_the_kernels_compute_the_feed_forward_and_its_gradients(p):
    """Two members of their own weights, rows that do not fill the last block, dropout redrawn in
    the backward from the seed: the output and every gradient equal PyTorch's with the kernels'
    own mask, which keeps about 1 - p of the units."""
    in_the_interpreter("equal", p)


def test_shapes_the_kernels_do_not_tile_are_refused():
    in_the_interpreter("refused")


def equal(p: float) -> None:
    import torch
    import ff_kernel

    torch.manual_seed(0)
    members, rows, d, hidden = 2, 100, 32, 128
    a = torch.randn(members, rows, d, requires_grad=True)
    w1 = (torch.randn(members, hidden, d) / d ** 0.5).requires_grad_()
    b1 = (0.1 * torch.randn(members, hidden)).requires_grad_()
    w2 = (torch.randn(members, d, hidden) / hidden ** 0.5).requires_grad_()
    grad = torch.randn(members, rows, d)
    y = ff_kernel.feed_forward(a, w1, b1, w2, p, seed=7)
    keep = ff_kernel.kept(members, rows, hidden, p, 7, a.device) if p else None
    expected = ff_kernel.reference(a, w1, b1, w2, keep, p)
    torch.testing.assert_close(y, expected, rtol=1e-5, atol=1e-5)
    for got, want in zip(torch.autograd.grad(y, [a, w1, b1, w2], grad), torch.autograd.grad(expected, [a, w1, b1, w2], grad)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=2e-5)
    if p:
        assert abs(keep.float().mean().item() - (1 - p)) < 0.02
        assert not torch.equal(keep, ff_kernel.kept(members, rows, hidden, p, 8, a.device))  # another seed, another mask


def refused() -> None:
    import torch
    import ff_kernel

    a = torch.randn(1, 8, 32)
    with pytest.raises(ValueError, match="multiple of 64"):
        ff_kernel.feed_forward(a, torch.randn(1, 96, 32), torch.zeros(1, 96), torch.randn(1, 32, 96))


if __name__ == "__main__":
    check, *args = sys.argv[1:]
    {"equal": lambda: equal(float(args[0])), "refused": refused}[check]()
