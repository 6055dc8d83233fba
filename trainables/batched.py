"""N seeds of one configuration trained as one model: their parameters stacked along a new first
dimension (torch.func.stack_module_state) and every step one vmapped forward and backward
(torch.func.vmap over functional_call). On a GPU, where one small model cannot fill the device,
this runs N seeds in little more than the time of one.

Each seed keeps what a run of its own would have: its initialisation (the model built after
`torch.manual_seed(seed)`, as `train` does), its data order (its own batch generator and length
buckets), its own dropout masks (vmap's randomness="different"), its own gradient clipping (the
norm per seed), and its own checkpoint selection and metrics (train.Selection). Adam, AdamW and
RMSprop update each entry from its own gradient alone, so one optimizer over the stacked
parameters takes every seed's own step. Without dropout the result equals N separate runs within
floating-point rounding (tests/test_batched.py); with dropout each seed draws other masks than its
separate run would, from the same distribution.

Models need a forward pass free of data-dependent Python control flow (`batchable` says which).
"""
from __future__ import annotations

import copy
import sys
import time
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch.func import functional_call, stack_module_state, vmap
from tqdm import tqdm

from .config import TrainConfig
from .tasks import load_task
from .train import Selection, add_sums, batch_source, batch_tensors, loss_of, make_model, make_optimizer, pick_device, predict, ratios, score_sums

# Models whose forward vmap can trace and whose result for a sample does not depend on how wide
# its batch is padded (seeds' batches are padded to the widest): the shared-weight Transformers
# without ACT (whose halting loop stops on a data-dependent test) and the set-attention layers.
# LSTMs pack their sequences by length on the host (pack_padded_sequence); the DNC's LSTM cell has
# no batching rule; the Transformer seq2seq baseline decodes as many blanks as its batch's longest
# target, which its other samples attend to. They train one seed per run.
BATCHABLE_MODELS = ("transformer", "transformer_rel", "transformer_rel_gate", "transformer_absrel_gate", "transformer_geometric",
                    "ndr", "transformer_compositional")

# report(metrics per seed, state): after every evaluation, as train.Reporter for each seed at once.
SeedsReporter = Callable[[dict[int, dict[str, Any]], Callable[[], dict]], None]


def batchable(flat: dict[str, Any]) -> str | None:
    """Why a trial config cannot train its seeds batched, or None where it can."""
    if flat.get("model") not in BATCHABLE_MODELS:
        return f"model {flat.get('model')!r} steps through its input with host-side control flow"
    if flat.get("act", "none") != "none":
        return "adaptive computation time stops on a data-dependent test"
    if flat.get("compile"):
        return "compile: torch.compile of the vmapped step is not supported"
    return None


def stacked_batch(parts: list[tuple[Any, np.ndarray]], device: torch.device) -> dict[str, torch.Tensor]:
    """One batch per seed (each seed's own rows, trimmed to its own longest), padded to the widest
    of them and stacked along a new first dimension. Padding is 0, the pad token's id; the models
    mask it, so a seed's result does not depend on the other seeds' lengths."""
    batches = [batch_tensors(split, index, device) for split, index in parts]
    out = {}
    for name in batches[0]:
        tensors = [b[name] for b in batches]
        if tensors[0].dim() >= 2 and name in ("tokens", "token_features", "targets"):
            width = max(t.shape[1] for t in tensors)
            tensors = [F.pad(t, (0, 0) * (t.dim() - 2) + (0, width - t.shape[1])) for t in tensors]
        out[name] = torch.stack(tensors)
    return out


def unstack(batch: dict[str, torch.Tensor], k: int) -> dict[str, torch.Tensor]:
    return {name: tensor[k] for name, tensor in batch.items()}


def clip_per_seed(cfg: TrainConfig, grads: list[torch.Tensor]) -> None:
    """torch.nn.utils.clip_grad_norm_ (or _value_) for each seed's slice of the stacked gradients."""
    if not cfg.grad_clip:
        return
    if cfg.grad_clip_by == "value":
        for g in grads:
            g.clamp_(-cfg.grad_clip, cfg.grad_clip)
        return
    norms = torch.stack([g.flatten(1).norm(dim=1) for g in grads]).norm(dim=0)  # (seeds,)
    scale = (cfg.grad_clip / (norms + 1e-6)).clamp(max=1.0)
    for g in grads:
        g.mul_(scale.view(-1, *[1] * (g.dim() - 1)))


def seed_state_dict(snapshot: dict, seed: int) -> dict[str, torch.Tensor]:
    """One seed's model weights (a state dict its model loads) from a snapshot of `train_seeds`."""
    k = snapshot["seeds_batched"].index(seed)
    return {name: value[k] for name, value in {**snapshot["params"], **snapshot["buffers"]}.items()}


def train_seeds(cfg: TrainConfig, seeds: list[int], report: SeedsReporter | None = None, resume_state: dict | None = None,
                log: Callable[[str], None] | None = print) -> dict[int, dict[str, Any]]:
    """Train `cfg` once per seed of `seeds`, all at once; returns each seed's final metrics."""
    why_not = batchable({**cfg.flat(), "model": cfg.model})
    if why_not:
        raise ValueError(f"seeds cannot be batched: {why_not}")
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    device = pick_device(cfg.device)
    task = load_task(cfg.task, cfg.task_options)
    rngs = [np.random.default_rng(seed) for seed in seeds]
    sources = [batch_source(cfg, task, rng) for rng in rngs]
    models = []
    for seed in seeds:
        torch.manual_seed(seed)  # the initialisation a run of its own would have
        models.append(make_model(cfg, task).to(device))
    params, buffers = stack_module_state(models)
    skeleton = copy.deepcopy(models[0]).to("meta")
    optimizer = make_optimizer(cfg, params.values())
    bar = tqdm(total=cfg.n_iters, unit="it", disable=not (log and sys.stderr.isatty()), dynamic_ncols=True)
    say = log and (bar.write if not bar.disable else log)
    selections = [Selection(cfg, task, device, say, f"{cfg.task}/{cfg.model} seed {seed}") for seed in seeds]
    if log:
        log(f"[{cfg.task}/{cfg.model}] {len(seeds)} seeds batched ({', '.join(map(str, seeds))}): "
            f"{sum(p.numel() for p in models[0].parameters()):,} parameters each on {device}; {cfg.n_iters:,} iterations")
    start = 0
    if resume_state:
        with torch.no_grad():
            for name, value in resume_state["params"].items():
                params[name].copy_(value)
        optimizer.load_state_dict(resume_state["optimizer"])
        torch.set_rng_state(resume_state["torch_rng"])
        start = resume_state["iteration"]
        for rng, (_, buckets), selection, saved in zip(rngs, sources, selections, resume_state["seeds"]):
            rng.bit_generator.state = saved["batch_rng"]
            selection.restore(saved)
            if buckets:
                buckets.restore(saved["buckets"])
    bar.update(start)

    def forward(p: dict, b: dict, batch: dict) -> torch.Tensor:
        return predict(lambda *args: functional_call(skeleton, (p, b), args), task.kind, batch)

    # The parameters vary along dim 0; so does the batch in training (a batch per seed), while every
    # seed is evaluated on the same rows.
    train_forward = vmap(forward, in_dims=(0, 0, 0), randomness="different")

    def snapshot() -> dict:
        return copy.deepcopy({
            "seeds_batched": list(seeds), "params": {name: p.detach() for name, p in params.items()}, "buffers": buffers,
            "optimizer": optimizer.state_dict(),
            "iteration": iteration, "torch_rng": torch.get_rng_state(),
            "seeds": [{"batch_rng": rng.bit_generator.state, **selection.state(), "buckets": buckets.state() if buckets else None}
                      for rng, (_, buckets), selection in zip(rngs, sources, selections)],
        })

    def load_seed(k: int) -> torch.nn.Module:
        """Seed k's parameters in a module of its own, for evaluation (train.evaluate runs it)."""
        with torch.no_grad():
            for name, p in models[k].named_parameters():
                p.copy_(params[name][k])
            for name, b in models[k].named_buffers():
                b.copy_(buffers[name][k])
        return models[k]

    n = len(seeds)
    loss_sums, train_sums, steps, since = torch.zeros(n, device=device), [{} for _ in seeds], 0, time.perf_counter()
    iteration = start
    for iteration in range(start + 1, cfg.n_iters + 1):
        batch = stacked_batch([next_batch() for next_batch, _ in sources], device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cfg.bf16):
            out = train_forward(params, buffers, batch)
        losses = torch.stack([loss_of(task.kind, out[k], unstack(batch, k)) for k in range(n)])
        optimizer.zero_grad(set_to_none=True)
        losses.sum().backward()  # seeds share no parameter: each gets its own loss's gradient
        clip_per_seed(cfg, [p.grad for p in params.values() if p.grad is not None])
        optimizer.step()
        loss_sums = loss_sums + losses.detach().float()
        train_sums = [add_sums(sums, score_sums(task.kind, out[k].detach(), unstack(batch, k))) for k, sums in enumerate(train_sums)]
        steps += 1
        bar.update()
        if iteration % cfg.eval_every == 0 or iteration == cfg.n_iters:
            mean_losses = (loss_sums / steps).tolist()  # waits for the window's last step, as train's rate does
            rate = steps / max(time.perf_counter() - since, 1e-9)
            for k, selection in enumerate(selections):
                if not selection.diverged:  # a diverged seed keeps its last metrics, as its own run would have stopped
                    selection(load_seed(k), iteration, mean_losses[k], ratios(train_sums[k]), rate)
            if report:
                report({seed: selection.metrics for seed, selection in zip(seeds, selections)}, snapshot)
            if all(selection.diverged for selection in selections):
                break
            loss_sums, train_sums, steps, since = torch.zeros(n, device=device), [{} for _ in seeds], 0, time.perf_counter()
    bar.close()
    return {seed: selection.metrics for seed, selection in zip(seeds, selections)}
