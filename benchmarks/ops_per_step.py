"""How many operators one training step dispatches: what a GPU launches (or replays as graph nodes)
per step, counted on any device, so that a machine without a GPU can see a change cut kernels; and
the bytes they read and write, which bound a step of small elementwise kernels on a GPU (its
memory moves them at a few TB/s).

  python benchmarks/ops_per_step.py [--preset ctl/ndr] [--members 1,4,20] [--rows 20] [--set key=value ...]
                                    [--kernels TEXT] [--fused CUT]

With `--bf16-activations`, what the step would move were its activations bf16 throughout (the
parameters cast inside the step), not only its matrix products' as autocast does. With
`--set compile=true`, instead, what Inductor's fused forward and backward graphs read and
write: the traffic compiling would leave, as the CPU backend fuses (the GPU's may fuse
differently); the loss, clipping and optimizer, which run eagerly, are not in it. Its rows put
each fused kernel's bytes on the line of the model most of its operators come from (matrix
products apart), forward and backward together: where hand-fused kernels would have to cut. With
`--fused CUT` too, what NDR's step would move were parts of its layer kernels of our own
(fused_layer.py); our ops (trainables' `fused_feed_forward`, the what-if's parts) have rows of
their own.

A stack of N members (trainables.batched.Stack, as a launch trains seeds) is warmed up, then one
step runs under a counting TorchDispatchMode: every aten operator below autograd and vmap, the
backward's and the optimizer's included. Views (which launch nothing) are counted apart. Counts
depend on the device only where an operator has a device-specific decomposition (on CUDA, torch's
own dropout is one fused operator, on the CPU three).
"""

from __future__ import annotations

import argparse
import logging
import re
from collections import Counter
from collections.abc import Callable

import torch
from fused_layer import CUTS, install
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from trainables.batched import Stack
from trainables.config import parse_trial_config, preset, set_override
from trainables.devices import setup_device
from trainables.tasks import load_task

WARMUP_STEPS = 3
MODEL_FRAME = re.compile(r'File "[^"]*/trainables/models/([^"]+)", line (\d+), in \w+\n\s*(.*)')
LAUNCH_NOTHING = ("_unsafe_view",)  # a view, though its schema does not say so


class CountOperators(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.computed: Counter[str] = Counter()
        self.moved: Counter[str] = Counter()  # bytes of every tensor an operator reads or writes
        self.views = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.is_view or func.overloadpacket.__name__ in LAUNCH_NOTHING:
            self.views += 1
        else:
            name = func.overloadpacket.__name__
            self.computed[name] += 1
            # an expanded input is read at its own size; an in-place output is also an input
            self.moved[name] += sum(
                t.untyped_storage().nbytes()
                if t.stride() and 0 in t.stride()
                else t.numel() * t.element_size()
                for t in tree_leaves((args, kwargs, out))
                if isinstance(t, torch.Tensor)
            )
        return out


def kind_of(node) -> str:
    """A scheduler node's kind: one of our kernels (trainables' sysgen ops, fused_layer.py's parts;
    by name), a matrix product (any other call Inductor leaves whole), or a kernel Inductor generated."""
    if type(node).__name__ != "ExternKernelSchedulerNode":
        return "fused kernel"
    op = str(getattr(node.node, "op_overload", ""))
    if op.startswith("sysgen."):
        return f"ours: {op.split('.')[1].replace('_backward', ' backward')}"
    if not op.startswith("sysgen_whatif."):
        return "matrix product"
    part = next((a for a in getattr(node.node, "constant_args", ()) if isinstance(a, str) and "#" in a), "?")
    return f"ours: {part.split('#')[0].lstrip('_')}" + (" backward" if "backward" in op else "")


def model_line(node) -> str:
    """The line of trainables/models that most of a compiled kernel's operators were traced from."""
    lines = Counter()
    for part in node.get_nodes() if hasattr(node, "get_nodes") else []:
        for origin in getattr(part.node, "origins", ()):
            frames = MODEL_FRAME.findall(origin.meta.get("stack_trace") or "")
            if frames:
                file, number, code = frames[-1]
                lines[f"{file}:{number}  {code.strip()[:70]}"] += 1
    return lines.most_common(1)[0][0] if lines else "(no model line)"


def watch_buffers() -> tuple[list[tuple[str, str, str, dict]], Callable[[], None]]:
    """(kind, model line, kernel, bytes per buffer) of every kernel Inductor counts until the
    returned function is called: what a kernel of our own would have to keep out of memory (the
    saved activations its backward reads again, masks kept apart)."""
    from torch._inductor.graph import GraphLowering  # noqa: PLC0415 - Inductor: --kernels with compile only

    seen, count_bytes = [], GraphLowering.count_bytes

    def counting(graph):
        out = count_bytes(graph)
        for node in graph.scheduler.nodes:
            accesses = node.get_read_write_buffer_accesses(include_reads=True, include_writes=True)
            if accesses:
                kind = kind_of(node)
                seen.append((kind, model_line(node), node.get_name(), dict(accesses)))
        return out

    GraphLowering.count_bytes = counting
    return seen, lambda: setattr(GraphLowering, "count_bytes", count_bytes)


def in_bf16(tensors: dict) -> dict:
    return {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in tensors.items()}


def count(
    cfg, n: int, rows: int, bf16_activations: bool = False, kernels: str | None = None, fused: bool = False
) -> None:
    device = setup_device(cfg)
    stack = Stack(cfg, [{"seed": seed} for seed in range(n)], load_task(cfg.task, cfg.task_options), device)
    # what the step would move were every activation bf16, not only the products' (a what-if: not a setting)
    if bf16_activations:
        forward = stack.forward
        stack.forward = lambda params, buffers, batch: forward(
            in_bf16(params), in_bf16(buffers), batch
        ).float()
    cfg = stack.cfg  # compile and bf16 as the stack runs them (auto decided for this device)
    if (kernels or fused) and not cfg.compile:  # our ops count as one kernel each only in a compiled graph
        raise SystemExit(
            f"ops_per_step.py: {'--kernels' if kernels else '--fused'} counts compiled "
            "kernels: add --set compile=true"
        )
    # One batch throughout: a compile is made per batch width, and each width moves its own bytes.
    batch = stack.next_batch()
    width = f" x {batch['tokens'].shape[-1]} tokens" if "tokens" in batch else ""
    where = f"{cfg.task}/{cfg.model}, {n} member(s) on {device}, batch {cfg.batch_size}{width}"
    if (
        cfg.compile
    ):  # Inductor sums each kernel's reads and writes as it compiles, where its metrics log is on
        from torch._functorch import config as functorch_config  # noqa: PLC0415 - Inductor: compiled steps only
        from torch._inductor import compile_fx, metrics  # noqa: PLC0415 - as above
        from torch._inductor import config as inductor_config  # noqa: PLC0415 - as above

        # A graph loaded from the compile caches brings its byte total back but not its kernels.
        inductor_config.fx_graph_cache = functorch_config.enable_autograd_cache = False
        compile_fx.inductor_metrics_log.setLevel(logging.INFO)
        compile_fx.inductor_metrics_log.propagate = False
        metrics.reset()
        buffers, stop_watching = watch_buffers() if kernels else ([], lambda: None)
    for _ in range(WARMUP_STEPS):
        stack.run(batch)
    if cfg.compile:  # its kernels run inside the compiled code, where a dispatch mode would not see them
        stop_watching()
        print(
            f"\n{where}, compiled: {metrics.num_bytes_accessed / 1e9:.3f} GB read and written by the forward "
            f"and backward graphs' {metrics.generated_kernel_count} generated kernels "
            "and their matrix products"
        )
        by_line = Counter()
        for node, words in metrics.nodes_num_elem:  # (scheduler node, its bytes / 4)
            by_line[f"{kind_of(node):28s}  {model_line(node)}"] += 4 * words
        print(f"{'GB':>7}  {'kind':28s}  model line most of their operators come from")
        for line, moved in by_line.most_common(rows):
            print(f"{moved / 1e9:7.3f}  {line}")
        if kernels:
            print(
                f"\nkernels whose model line holds {kernels!r}: MB moved, then each "
                "buffer read or written (MB)"
            )
            for kind, line, name, accesses in buffers:
                if kernels in line:
                    print(
                        f"{sum(accesses.values()) / 1e6:8.2f}  {kind:28s} {name[:40]:40s} "
                        + ", ".join(f"{buffer} {size / 1e6:.2f}" for buffer, size in accesses.items())
                    )
        return
    with CountOperators() as mode:
        stack.run(batch)
    print(
        f"\n{where}: {sum(mode.computed.values())} operators per step (and {mode.views} views), "
        f"{sum(mode.moved.values()) / 1e9:.3f} GB read and written"
    )
    print(f"{'operators':>9}  {'GB':>7}  operator")
    for name, _ in mode.moved.most_common(rows):
        print(f"{mode.computed[name]:9d}  {mode.moved[name] / 1e9:7.3f}  {name}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", default="ctl/ndr", help="task/model")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--members", default="1,4,20")
    parser.add_argument("--rows", type=int, default=20)
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        help="key=value over the preset (default: batch_size=32, a small train set)",
    )
    parser.add_argument(
        "--bf16-activations",
        action="store_true",
        help="cast the parameters to bf16 inside each step (float32 masters), so "
        "that every activation is bf16",
    )
    parser.add_argument(
        "--fused",
        metavar="CUT",
        choices=CUTS,
        help="parts of NDR's layer as kernels of our own, each counted as its inputs and outputs "
        "(a what-if: fused_layer.py)",
    )
    parser.add_argument(
        "--kernels",
        metavar="TEXT",
        help="with compile=true: each kernel whose model line holds TEXT "
        "(e.g. transformer.py:298), with the bytes of every buffer it reads and writes",
    )
    args = parser.parse_args()
    task, model = args.preset.split("/")
    flat = preset(task, model)
    flat = {
        **flat,
        "device": args.device,
        "batch_size": 32,
        "task_options": {**flat.get("task_options", {}), "train_size": 2000},
    }
    for assignment in args.set:
        set_override(flat, assignment)
    cfg = parse_trial_config(flat)
    if (
        args.fused
    ):  # a what-if: parts of NDR's layer as kernels of our own (fused_layer.py), for every count below
        install(args.fused)
    for n in (int(n) for n in args.members.split(",")):
        count(cfg, n, args.rows, args.bf16_activations, args.kernels, bool(args.fused))


if __name__ == "__main__":
    main()
