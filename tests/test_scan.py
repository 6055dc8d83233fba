"""SCAN: the generator against an independent interpreter written from Lake & Baroni's rules (their
Fig. 7: a command is read left to right, not enumerated), the papers' split sizes and examples, and
the encoder-decoder against its equations position by position, and its two modes (teacher forcing,
greedy decoding) against each other."""

from __future__ import annotations

import collections
import math

import numpy as np
import pytest
import torch

from trainables.config import TrainConfig, parse_trial_config, preset
from trainables.models import build_model
from trainables.models.transformer import sinusoids
from trainables.tasks import load_task, scan, task_config
from trainables.train import train

ACTION = {"walk": "I_WALK", "look": "I_LOOK", "run": "I_RUN", "jump": "I_JUMP"}


def interpret(command: str) -> list[str]:
    """[[command]] by the interpretation rules: conjunctions first, then repetition, then a verb phrase."""
    words = command.split()
    for conjunction in ("and", "after"):
        if conjunction in words:
            k = words.index(conjunction)
            first, second = interpret(" ".join(words[:k])), interpret(" ".join(words[k + 1 :]))
            return first + second if conjunction == "and" else second + first
    if words[-1] in ("twice", "thrice"):
        return interpret(" ".join(words[:-1])) * (2 if words[-1] == "twice" else 3)
    if len(words) == 1:
        return [ACTION[words[0]]]
    x, direction = words[0], words[-1]
    turn = "I_TURN_LEFT" if direction == "left" else "I_TURN_RIGHT"
    act = [] if x == "turn" else [ACTION[x]]
    if len(words) == 2:
        return [turn] + act
    if words[1] == "opposite":
        return [turn, turn] + act
    assert words[1] == "around", command
    return ([turn] + act) * 4


def test_every_command_agrees_with_the_interpreter_and_appears_once():
    pairs = scan.commands()
    texts = [" ".join(words) for words, _ in pairs]
    assert len(pairs) == len(set(texts)) == 20_910  # the SCAN data set's size
    assert all(interpret(text) == actions for text, (_, actions) in zip(texts, pairs))


def test_the_papers_examples():
    actions = {" ".join(words): " ".join(a) for words, a in scan.commands()}
    assert actions["jump twice"] == "I_JUMP I_JUMP"  # PANM Sec. 3.3
    assert (
        actions["walk and turn opposite right"] == "I_WALK I_TURN_RIGHT I_TURN_RIGHT"
    )  # PANM App. D (Table 6's example)
    # The Compositional Attention paper's App. C.6 writes "LTURN LTURN JUMP WALK WALK" for this one:
    # "thrice" makes three WALKs by the grammar's rules.
    assert (
        actions["jump opposite left and walk thrice"] == "I_TURN_LEFT I_TURN_LEFT I_JUMP I_WALK I_WALK I_WALK"
    )
    assert max(len(a.split()) for a in actions.values()) == scan.LONGEST


def test_length_splits_match_the_papers():
    lengths = collections.Counter(len(a) for _, a in scan.commands())
    assert sum(n for k, n in lengths.items() if k <= 22) == 16_990  # PANM App. D.3: train
    assert sum(n for k, n in lengths.items() if k > 22) == 3_920  # and test
    assert lengths[29] == 0  # so the cut-offs 28 and 29 (Compositional Attention Table 4) split alike
    task = load_task("scan", {"length_cutoff": 26})
    train_, iid, test = (task.splits[s] for s in ("train", "iid_valid", "test"))
    assert np.array_equal(
        task.splits["ood_valid"].tokens, iid.tokens
    )  # the IID hold-out fills both validation slots
    assert len(train_) + len(iid) == sum(n for k, n in lengths.items() if k <= 26) and len(test) == sum(
        n for k, n in lengths.items() if k > 26
    )
    assert len(iid) == int(0.1 * (len(train_) + len(iid)))
    assert train_.depths.max() <= 26 < test.depths.min()
    seen = {tuple(s) for s in train_.sequences()}
    assert not seen & {tuple(s) for s in iid.sequences()} and not seen & {tuple(s) for s in test.sequences()}
    for split in (
        train_,
        iid,
        test,
    ):  # targets: the actions, then <eos>; a sample's depth is its number of actions
        targets = split.target_sequences()
        eos = scan.VOCAB.index("<eos>")
        assert all(t[-1] == eos and eos not in t[:-1] for t in targets)
        assert np.array_equal(split.target_lengths - 1, split.depths)
        words = [task.decode(s) for s in split.sequences()[:200]]
        assert all(task.decode(t[:-1]) == interpret(" ".join(w)) for w, t in zip(words, targets[:200]))


@pytest.mark.parametrize("options", [{"length_cutoff": 48}, {"length_cutoff": 0}, {"iid_fraction": 1.0}])
def test_bad_options_name_the_key(options):
    with pytest.raises(ValueError, match=next(iter(options))):
        task_config("scan", options)


@pytest.mark.parametrize(
    "model, options",
    [
        ("transformer_enc_dec", {"universal": False}),
        ("transformer_enc_dec", {"relative_positions": True}),
        ("transformer_enc_dec_compositional", {"n_retrievals": 2}),
        ("transformer_enc_dec_panm", {"hidden": 24}),
        ("transformer_enc_dec_panm", {"hidden": 24, "relative_positions": True}),
    ],
)
def test_greedy_decoding_is_teacher_forcing_on_its_own_outputs(model, options):
    """Greedy decoding recomputes the prefix each step; fed its own tokens as the target, teacher
    forcing must give the same logits (the causal mask hides later tokens), and a later target token
    must not change an earlier position's logits; nor may the padding after a command."""
    torch.manual_seed(0)
    task = load_task("scan", {})
    net = build_model(model, {"d_model": 32, "n_heads": 4, "dropout": 0.0, **options}, task).eval()
    split = task.splits["test"]
    tokens, lengths = torch.from_numpy(split.tokens[:6]).long(), torch.from_numpy(split.lengths[:6]).long()
    with torch.no_grad():
        greedy = net(tokens, lengths, 9)
        forced = net(tokens, lengths, 9, greedy.argmax(-1))
        torch.testing.assert_close(forced, greedy, atol=1e-5, rtol=1e-5)
        changed = greedy.argmax(-1).clone()
        changed[:, 5] = (changed[:, 5] + 1) % len(task.vocab)
        torch.testing.assert_close(
            net(tokens, lengths, 9, changed)[:, :6], forced[:, :6], atol=1e-5, rtol=1e-5
        )
        padded = torch.cat([tokens, torch.randint(1, len(task.vocab), (len(tokens), 4))], 1)
        padded[torch.arange(padded.shape[1])[None] >= lengths[:, None]] = torch.randint(
            1, len(task.vocab), ()
        ).item()
        torch.testing.assert_close(net(padded, lengths, 9), greedy, atol=1e-5, rtol=1e-5)


def slow_attention(att, queries: list, keys: list, heads: int) -> list:
    """Multi-head scaled dot-product attention of each query vector over a list of key vectors (the
    visible ones only), head by head: W_o [softmax_j(q_i^h . k_j^h / sqrt(d_h)) v_j^h]_h + b_o."""
    d_head = len(queries[0]) // heads
    out = []
    for x in queries:
        q = att.query.weight @ x + att.query.bias
        mixed = []
        for hd in range(heads):
            part = slice(hd * d_head, (hd + 1) * d_head)
            ks = [(att.key.weight @ y)[part] for y in keys]
            vs = [(att.value.weight @ y + att.value.bias)[part] for y in keys]
            scores = torch.stack([q[part] @ k for k in ks]) / math.sqrt(d_head)
            weights = torch.softmax(scores, 0)
            mixed.append(sum(w * v for w, v in zip(weights, vs)))
        out.append(att.out.weight @ torch.cat(mixed) + att.out.bias)
    return out


def slow_encoder_decoder(net, tokens: list[int], targets: list[int], bos: int, heads: int) -> torch.Tensor:
    """Csordás et al. (2021)'s encoder-decoder for one command, position by position: post-norm
    layers (each sublayer's output added to its input, then LayerNorm); the decoder attends causally
    to its own states, then to the whole encoder output; logits from the tied output embedding."""

    def norm(module, x):
        return torch.nn.functional.layer_norm(x, x.shape, module.weight, module.bias)

    def ff(block, x):
        return block[3].weight @ torch.relu(block[0].weight @ x + block[0].bias) + block[3].bias

    def embed(embedding, ids):
        return [
            embedding.weight[t] + sinusoids(torch.tensor([i]), embedding.weight.shape[1])[0]
            for i, t in enumerate(ids)
        ]

    h = embed(net.input_embedding, [bos, *tokens])
    for k in range(net.cfg.encoder_layers):
        layer = net.encoder[0 if net.cfg.universal else k]
        attended = slow_attention(layer.attention, h, h, heads)
        a = [norm(layer.norm_attention, x + y) for x, y in zip(h, attended)]
        h = [norm(layer.norm_ff, x + ff(layer.ff, x)) for x in a]
    memory = h
    h = embed(net.output_embedding, [bos, *targets[:-1]])
    for k in range(net.cfg.decoder_layers):
        layer = net.decoder[0 if net.cfg.universal else k]
        own = [slow_attention(layer.self_attention, [x], h[: i + 1], heads)[0] for i, x in enumerate(h)]
        h = [norm(layer.norms[0], x + y) for x, y in zip(h, own)]
        h = [
            norm(layer.norms[1], x + y)
            for x, y in zip(h, slow_attention(layer.cross_attention, h, memory, heads))
        ]
        h = [norm(layer.norms[2], x + ff(layer.ff, x)) for x in h]
    return torch.stack([net.output_embedding.weight @ x + net.output_bias for x in h])


@pytest.mark.parametrize("universal", [True, False])
def test_the_encoder_decoder_against_its_equations(universal):
    torch.manual_seed(1)
    task = load_task("scan", {})
    net = (
        build_model(
            "transformer_enc_dec",
            {
                "d_model": 16,
                "n_heads": 4,
                "dropout": 0.0,
                "universal": universal,
                "encoder_layers": 2,
                "decoder_layers": 2,
            },
            task,
        )
        .double()
        .eval()
    )
    with torch.no_grad():
        net.output_bias.normal_()
    split = task.splits["test"]
    tokens, lengths = torch.from_numpy(split.tokens[:3]).long(), torch.from_numpy(split.lengths[:3]).long()
    targets = torch.from_numpy(split.targets[:3, :7]).long()
    with torch.no_grad():
        forced = net(tokens, lengths, 7, targets)
        for b in range(3):
            slow = slow_encoder_decoder(
                net, tokens[b, : lengths[b]].tolist(), targets[b].tolist(), task.bos_id, 4
            )
            torch.testing.assert_close(forced[b], slow)


def test_panm_replaces_the_last_decoder_layer():
    """App. D.3: a 3-layer decoder whose last layer is PANM's Controller, reading z_t from the other two."""
    task = load_task("scan", {})
    net = build_model("transformer_enc_dec_panm", {}, task)
    assert len(net.decoder) == 2 and net.cfg.decoder_layers == 2 and net.output_bias is None
    assert (
        net.pointer_decoder.controller.input_size == (2 + 1) * 128 + 128
    )  # two Mode-1 and one Mode-2 reads, z_t
    baseline = build_model("transformer_enc_dec", {"universal": False}, task)
    assert (
        abs(sum(p.numel() for p in net.parameters()) / sum(p.numel() for p in baseline.parameters()) - 1)
        < 0.02
    )
    with pytest.raises(ValueError, match="decoder_layers"):
        build_model("transformer_enc_dec_panm", {"decoder_layers": 1}, task)


@pytest.mark.parametrize(
    "model,attention_dropout,scored_by",
    [("transformer_enc_dec", 0.5, None), ("transformer_enc_dec_compositional", 0.0, "linear")],
)
def test_the_presets_attention_as_the_authors_scan_code(model, attention_dropout, scored_by):
    """The multi-head baseline drops its attention weights at the model's rate (Csordas et al.'s
    code); the Compositional Attention authors' SCAN attention drops none and scores each retrieval
    with a linear layer on the retrieval query and the retrieved value (dot=False)."""
    cfg = parse_trial_config(preset("scan", model))
    net = build_model(model, cfg.model_options, load_task("scan", {}))
    rates = {module.p for name, module in net.named_modules() if name.endswith("attention_dropout")}
    assert rates == {attention_dropout}
    scorers = [module for name, module in net.named_modules() if name.endswith("retrieval_score")]
    assert {type(module).__name__.lower() for module in scorers} == ({scored_by} if scored_by else set())


def test_relative_positions_only_with_softmax_attention():
    with pytest.raises(ValueError, match="relative_positions"):
        build_model("transformer_enc_dec_compositional", {"relative_positions": True}, load_task("scan", {}))


@pytest.mark.long
def test_the_trainer_learns_the_short_commands():
    """A few hundred steps of a small model: greedy decoding's tokens beat always answering the most
    frequent one, and the scores the papers report (exact match at the last step) are there."""
    cfg = TrainConfig(
        task="scan",
        model="transformer_enc_dec",
        task_options={"length_cutoff": 40, "eval_size": 300},
        model_options={"d_model": 32, "n_heads": 4, "dropout": 0.0},
        optimizer="adam",
        lr=3e-3,
        batch_size=64,
        n_iters=300,
        eval_every=300,
        threads=1,
    )
    metrics = train(cfg, log=None)
    targets = np.concatenate(
        load_task("scan", {"length_cutoff": 40, "eval_size": 300}).splits["iid_valid"].target_sequences()
    )
    assert metrics["iid_valid_token_acc_final"] > np.bincount(targets).max() / len(targets) + 0.1, metrics
    assert {"test_seq_acc_final", "test_token_acc_final", "best_ood_valid_seq_acc"} <= set(metrics)
