"""benchmarks/fused_layer.py's what-if (ops_per_step.py --fused): NDR's layer with parts as opaque
ops must compute what the layer does, or its byte count would be of another step. Each op
recomputes its part in its backward, its dropout redrawn from the generator state it saved."""

import sys
from pathlib import Path

import pytest
import torch
from test_feed_forward_op import step
from test_train import tiny

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import fused_layer  # noqa: E402


@pytest.mark.parametrize(
    "cut, dropout", [("elementwise", 0.3), ("feed_forwards", 0.3), ("sublayers", 0.3), ("layer", 0.0)]
)
def test_the_layer_cut_into_opaque_parts_trains_as_the_layer_does(cut, dropout, monkeypatch):
    """A stack of two members (their own learning rates), with dropout and gate-drop where each
    part draws its masks after the one before it, so in the order the stacked layer draws them
    for all members at once: losses and gradients agree to float32 rounding. The layer in one
    part draws each member's masks together, so it is compared without dropout."""
    cfg = tiny("ndr", dropout=dropout, query_dropout=dropout / 3, gate_drop=2 * dropout / 3)
    members = [{"seed": 0, "lr": 1e-3}, {"seed": 1, "lr": 3e-3}]
    losses, grads = step(cfg, members)
    fused_layer.install(cut, monkeypatch.setattr)
    parts = len(fused_layer.PARTS)
    fused_losses, fused_grads = step(cfg, members)
    assert len(fused_layer.PARTS) > parts  # the stack's layer ran as parts
    torch.testing.assert_close(fused_losses, losses)
    assert fused_grads.keys() == grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(fused_grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)


def test_an_unknown_cut_is_refused():
    with pytest.raises(ValueError, match="elementwise, feed_forwards, sublayers, layer"):
        fused_layer.install("whole")


def test_layers_other_than_ndrs_run_as_they_are(monkeypatch):
    """The parts are NDR's (geometric attention, the copy gate): another model's layer is left whole."""
    cfg = tiny("transformer_rel_gate", dropout=0.0, query_dropout=0.0)
    members = [{"seed": 0}]
    losses, grads = step(cfg, members)
    fused_layer.install("sublayers", monkeypatch.setattr)
    fused_losses, fused_grads = step(cfg, members)
    torch.testing.assert_close(fused_losses, losses)
    for name, grad in grads.items():
        torch.testing.assert_close(fused_grads[name], grad, msg=name)
