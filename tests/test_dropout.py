"""trainables' Dropout (a uniform-noise mask on the CPU) against the definition: each element kept
with probability 1 - p and then scaled by 1 / (1 - p), else zero; the identity outside training."""

import math

import torch
from torch.func import vmap

from trainables.models.dropout import Dropout


def slow_dropout(x: torch.Tensor, uniform: torch.Tensor, p: float) -> torch.Tensor:
    """Element by element: kept where its uniform draw is at least p."""
    out = torch.empty_like(x)
    for i, (value, u) in enumerate(zip(x.flatten().tolist(), uniform.flatten().tolist())):
        out.view(-1)[i] = value / (1 - p) if u >= p else 0.0
    return out


def test_the_mask_and_scale_are_the_definitions_and_the_gradient_follows_them():
    p, x = 0.3, torch.randn(4, 5, 6, requires_grad=True)
    layer = Dropout(p).train()
    torch.manual_seed(3)
    y = layer(x)
    torch.manual_seed(3)
    uniform = torch.rand_like(x)
    torch.testing.assert_close(y, slow_dropout(x.detach(), uniform, p))
    y.sum().backward()
    torch.testing.assert_close(x.grad, (uniform >= p).float() / (1 - p))


def test_elements_are_kept_with_probability_one_minus_p():
    for p in (0.1, 0.5, 0.9):
        kept = (Dropout(p).train()(torch.ones(1_000_000)) != 0).float().mean().item()
        assert abs(kept - (1 - p)) < 5 * math.sqrt(p * (1 - p) / 1_000_000), (p, kept)


def test_outside_training_or_at_p_zero_it_is_the_identity():
    x = torch.randn(3, 7)
    assert torch.equal(Dropout(0.5).eval()(x), x)
    assert torch.equal(Dropout(0.0).train()(x), x)


def test_stacked_members_draw_their_own_masks():
    """Batched seeds (trainables.batched) vmap the forward with randomness="different"."""
    masks = vmap(lambda x: Dropout(0.5).train()(x), randomness="different")(torch.ones(2, 1000))
    assert not torch.equal(masks[0], masks[1])


def test_stacked_members_drop_at_their_own_rates_and_scale_by_them():
    """A stack whose members' rates differ (trainables.batched sets their rates in tensors) keeps the
    rates as a stacked buffer: each member's mask and scale are the definition's at its own rate, the
    gate-drop's too."""
    from torch.func import functional_call

    from trainables.models.dropout import GateDrop

    rates, n = torch.tensor([0.0, 0.1, 0.5]), 200_000
    for module, scaled in ((Dropout(0.3), True), (GateDrop(0.3), False)):
        module.train().rate_in_tensor = True
        out = vmap(lambda rate, x: functional_call(module, {"rate": rate}, (x,)), randomness="different")(
            rates, torch.ones(3, n, 1)
        )
        for rate, member in zip(rates.tolist(), out[..., 0]):
            kept = member[member != 0]
            assert (
                abs(len(kept) / n - (1 - rate)) < 5 * math.sqrt(max(rate * (1 - rate), 1e-12) / n) + 1e-12
            ), (module, rate)
            torch.testing.assert_close(kept, torch.full_like(kept, 1 / (1 - rate) if scaled else 1.0))
