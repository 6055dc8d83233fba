"""What NDR's training step would move were parts of its layer each one kernel of our own, reading
its inputs once and writing its outputs once: a what-if for ops_per_step.py --fused (of these
kernels only the feed-forward's is written: trainables/models/feed_forward_op.py).

Issue 21 asks 1,000 NDR member-steps/s of one H100: at most about 3.35 GB a member-step at full
bandwidth, 1.9 at the 58% of it the compiled stack of 20 reached. Inductor's compiled bf16 step
moves 5.59. Each part named below becomes one torch custom op, which Inductor leaves whole and
counts like a matrix product: its inputs read once, its outputs written once. Its backward is a
second op that reads the part's inputs and output gradients and writes the input gradients,
recomputing the part inside (its dropout masks redrawn from the saved generator state, as a
Triton kernel redraws them from a seed); so nothing inside a part is kept for the backward. The
op bodies run the model's own code (the layer's modules with the op's tensors as their
parameters, member by member in a stack), so the what-if computes what the model does.

Cuts (`--fused CUT`):
- `elementwise`: the layer's elementwise work around its products, in three kernels: the first
  feed-forward product's bias, ReLU and dropout (both feed-forwards); Eq. 1's bias, dropout,
  residual and LayerNorm; Eq. 2-4's bias and LayerNorm, the gate's bias and sigmoid, gate-drop
  and the mix. The products stay aten's.
- `sublayers`: the attention (Eq. 9-10, with its products), and each feed-forward with both its
  products, as kernels of their own beside the elementwise ones: what a kernel that keeps a
  sublayer's intermediate results on chip would move. (A layer with `mask_self`, which NDR's
  tasks do not set, keeps its attention Inductor's.)
- `feed_forwards`: `sublayers` with the attention left to Inductor.
- `layer`: the whole layer step as one kernel, the floor: it reads h and the weights and writes
  the next h.
"""

from __future__ import annotations

import inspect
import itertools
from operator import attrgetter

import torch
import torch.nn.functional as F
from torch import Tensor

from trainables.models.transformer import Layer

CUTS = ("elementwise", "feed_forwards", "sublayers", "layer")
# op key -> (function of (module, *tensors), module, its parameter and buffer names, whether a
# product reads its output: written in the products' dtype under autocast, else in its first tensor's)
PARTS: dict[str, tuple] = {}
_keys = itertools.count()
RNG_STATE_BYTES = torch.get_rng_state().numel()  # the CPU generator's; the what-if counts on the CPU


def _call_part(key: str, inputs: list[Tensor], member_dims: list[int], autocast: str) -> list[Tensor]:
    """The part's function on `inputs` (its tensors, then its module's parameters and buffers),
    over members where a dim is not -1, under autocast to the dtype named (none if "")."""
    fn, module, names, _ = PARTS[key]
    n = len(inputs) - len(names)

    def body(*xs):
        with torch.nn.utils.stateless._reparametrize_module(module, dict(zip(names, xs[n:]))):
            out = fn(module, *xs[:n])
        return list(out) if isinstance(out, (tuple, list)) else [out]

    with torch.autocast(
        inputs[0].device.type, dtype=getattr(torch, autocast or "float32"), enabled=bool(autocast)
    ):
        if all(d == -1 for d in member_dims):
            return body(*inputs)
        # Member by member, not vmapped: a compiled graph runs its custom ops with functorch off.
        # The members draw their dropout one after the other, as a vmapped draw lays them out.
        members = max(t.shape[d] for t, d in zip(inputs, member_dims) if d != -1)
        outs = [
            body(*(t if d == -1 else t.select(d, k) for t, d in zip(inputs, member_dims)))
            for k in range(members)
        ]
        return [torch.stack(column) for column in zip(*outs)]


def _part_op(n: int):
    """The op of parts that read n tensors (one per count: Dynamo traces a custom op under vmap
    with tensors as arguments, not in a list) -> the part's outputs, then the generator state its
    dropout drew from."""
    if n in _PART_OPS:
        return _PART_OPS[n]
    names = [f"t{i}" for i in range(n)]
    tensors = ", ".join(f"Tensor {t}" for t in names)
    schema = f"(str key, {tensors}, int[] member_dims, str autocast) -> (Tensor, Tensor)"

    def forward(key, *args):
        *inputs, member_dims, autocast = args
        state = torch.get_rng_state()
        [out] = _call_part(key, inputs, member_dims, autocast)
        return out.clone(), state

    op = torch.library.custom_op(f"sysgen_whatif::part{n}", forward, mutates_args=(), schema=schema)

    @op.register_fake
    def _(
        key, *args
    ):  # shaped as the part's first tensor; written in the products' dtype where a product reads it
        *inputs, member_dims, autocast = args
        products = PARTS[key][3] and autocast
        return torch.empty_like(inputs[0], dtype=getattr(torch, autocast) if products else None), torch.empty(
            RNG_STATE_BYTES, dtype=torch.uint8
        )

    def setup(ctx, inputs, output):
        ctx.key, *tensors, ctx.member_dims, ctx.autocast = inputs
        ctx.save_for_backward(*tensors, output[-1])

    def backward(ctx, grad, _):
        *tensors, state = ctx.saved_tensors
        got = part_backward(ctx.key, tensors, ctx.member_dims, ctx.autocast, state, [grad])
        return None, *(g if t.is_floating_point() else None for g, t in zip(got, tensors)), None, None

    op.register_autograd(backward, setup_context=setup)

    def batched(info, in_dims, key, *args):
        *inputs, member_dims, autocast = args
        out = op(key, *inputs, [-1 if d is None else d for d in in_dims[1 : n + 1]], autocast)
        return out, (0, None)

    torch.library.register_vmap(op, batched)
    _PART_OPS[n] = op
    return op


_PART_OPS: dict[int, object] = {}


@torch.library.custom_op("sysgen_whatif::part_backward", mutates_args=())
def part_backward(
    key: str, inputs: list[Tensor], member_dims: list[int], autocast: str, state: Tensor, grads: list[Tensor]
) -> list[Tensor]:
    """-> each input's gradient (an empty tensor for one that takes none: masks, indices)."""
    wanted = [i for i, t in enumerate(inputs) if t.is_floating_point()]

    def of_wanted(*xs):
        given = dict(zip(wanted, xs))
        return _call_part(key, [given.get(i, t) for i, t in enumerate(inputs)], member_dims, autocast)

    saved = torch.get_rng_state()
    torch.set_rng_state(state)
    try:  # torch.func, not torch.autograd: an op's body runs below autograd's dispatch
        _, vjp = torch.func.vjp(of_wanted, *(inputs[i] for i in wanted))
        got = {i: g.clone() for i, g in zip(wanted, vjp(grads))}  # none may alias a gradient given
    finally:
        torch.set_rng_state(saved)
    return [got.get(i, torch.empty(0)) for i in range(len(inputs))]


@part_backward.register_fake
def _(key, inputs, member_dims, autocast, state, grads):
    return [torch.empty_like(t) if t.is_floating_point() else torch.empty(0) for t in inputs]


def kernel(fn, layer: Layer, path: str, uses: tuple[str, ...] = ("",), to_products: bool = False):
    """fn(module, *tensors), module the layer's submodule at `path`, as one opaque op: the call
    (layer, *tensors) reads its tensors and those of the module's parameters and buffers named by
    `uses` (prefixes; all by default), and returns fn's outputs. The call reads them from the layer
    it is given: a stack's copy of the model runs with its members' parameters swapped in."""
    module = layer.get_submodule(path)
    names = [
        name
        for name, _ in itertools.chain(module.named_parameters(), module.named_buffers())
        if any(name == u or name.startswith(f"{u}.") or not u for u in uses)
    ]
    key = f"{fn.__name__}#{next(_keys)}"
    PARTS[key] = (fn, module, names, to_products)
    n_tensors = (
        sum(p.default is p.empty for p in inspect.signature(fn).parameters.values()) - 1
    )  # past the module
    op = _part_op(n_tensors + len(names))  # made here: not while torch.compile traces

    def call(layer: Layer, *tensors):
        module, device = layer.get_submodule(path), tensors[0].device.type
        autocast = (
            str(torch.get_autocast_dtype(device)).removeprefix("torch.")
            if torch.is_autocast_enabled(device)
            else ""
        )
        inputs = [*tensors, *(attrgetter(name)(module) for name in names)]
        out = op(key, *inputs, [-1] * len(inputs), autocast)
        return out[0]

    return call


# The layer's parts: the model's own code, cut where a kernel would be -----------------------------


def _ff_first(ff, x):  # the first product's epilogue: bias, ReLU, dropout, in the product's dtype as Linear's
    return ff[2](ff[1](x + ff[0].bias.to(x.dtype)))


def _residual_norm(layer, h, attended):  # Eq. 1, the output product's bias added here
    a = layer.norm_attention(h + layer.dropout(attended + layer.attention.out.bias))
    device = a.device.type  # written as the products that read it take it
    return a.to(torch.get_autocast_dtype(device)) if torch.is_autocast_enabled(device) else a


def _gated_update(layer, h, f, g):  # Eq. 2-4, the feed-forwards' second biases added here
    u = layer.norm_update(layer.update_dropout(f + layer.ff[3].bias))
    gate = layer.gate_drop(torch.sigmoid(g + layer.gate[3].bias))
    return torch.lerp(h, u.to(h.dtype), gate.to(h.dtype))


def _attention(attention, h, key_padding, mask_self=False):  # the attention, its output product without bias
    return F.linear(attention.mix(h, key_padding, mask_self)[0], attention.out.weight)


def _feed_forward(ff, a):  # both products, the second without its bias
    return F.linear(_ff_first(ff, F.linear(a, ff[0].weight)), ff[3].weight)


def ndr(layer: Layer) -> bool:
    return layer.gated and layer.attention.kind == "geometric"


def install(cut: str, set_attribute=setattr) -> None:
    """Layer.forward for NDR's layers (gated, geometric attention), its parts as kernels by `cut`;
    other layers as they are. Each layer registers its parts as it is built: a part registered
    while torch.compile traces would not be there for the trace's own fake calls."""
    if cut not in CUTS:
        raise ValueError(f"--fused: one of {', '.join(CUTS)}, got {cut!r}")
    build, whole = Layer.__init__, Layer.forward

    def _layer(
        layer, h, key_padding
    ):  # the layer as the model has it; its attention weights and gate are for plots
        return whole(layer, h, key_padding)[0]

    def init(layer: Layer, *args, **kwargs):
        build(layer, *args, **kwargs)
        layer.parts = (
            {
                name: kernel(fn, layer, path, uses, to_products)
                for name, fn, path, uses, to_products in [
                    ("ff_first", _ff_first, "ff", ("0.bias", "2"), False),
                    ("gate_first", _ff_first, "gate", ("0.bias", "2"), False),
                    (
                        "residual_norm",
                        _residual_norm,
                        "",
                        ("attention.out.bias", "norm_attention", "dropout"),
                        True,
                    ),
                    (
                        "gated_update",
                        _gated_update,
                        "",
                        ("ff.3.bias", "gate.3.bias", "norm_update", "update_dropout", "gate_drop"),
                        False,
                    ),
                    ("attention", _attention, "attention", ("",), True),
                    ("ff", _feed_forward, "ff", ("",), True),
                    ("gate", _feed_forward, "gate", ("",), True),
                    ("layer", _layer, "", ("",), False),
                ]
            }
            if ndr(layer)
            else {}
        )

    def forward(layer: Layer, h: Tensor, key_padding: Tensor):
        def run(name, *tensors):
            return layer.parts[name](layer, *tensors)

        if not layer.parts:
            return whole(layer, h, key_padding)
        if cut == "layer":
            return run("layer", h, key_padding), None, None
        if cut == "sublayers" and not layer.mask_self:
            attended = run("attention", h, key_padding)
        else:
            attended = _attention(layer.attention, h, key_padding, layer.mask_self)
        a = run("residual_norm", h, attended)
        if cut in ("sublayers", "feed_forwards"):
            f, g = run("ff", a), run("gate", a)
        else:
            f = F.linear(run("ff_first", F.linear(a, layer.ff[0].weight)), layer.ff[3].weight)
            g = F.linear(run("gate_first", F.linear(a, layer.gate[0].weight)), layer.gate[3].weight)
        return run("gated_update", h, f, g), None, None

    set_attribute(Layer, "__init__", init)
    set_attribute(Layer, "forward", forward)
