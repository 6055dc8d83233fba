"""Dyck next-symbol prediction: the generators against an independent evaluator, the stack RNN
against a direct per-sample implementation of its equations, and the models' causality."""

from __future__ import annotations

import collections
import itertools
import math

import numpy as np
import pytest
import torch

from trainables.config import TrainConfig
from trainables.kinds import NEXT_SYMBOL_SETS, SEQUENCE_TO_SEQUENCE
from trainables.models import build_model
from trainables.tasks import dyck, load_task, task_config
from trainables.train import train

PAIRS = {"(": ")", "[": "]", "{": "}"}


def reduced(string: str) -> str:
    """Delete adjacent matched pairs until none is left: "" exactly for a balanced string, the
    unmatched opening brackets for a prefix of one."""
    while True:
        shorter = string
        for o, c in PAIRS.items():
            shorter = shorter.replace(o + c, "")
        if shorter == string:
            return string
        string = shorter


def allowed_next(prefix: str, n_pairs: int) -> set[str]:
    openers = list(PAIRS)[:n_pairs]
    left = reduced(prefix)
    return set(openers) | ({PAIRS[left[-1]]} if left else set())


def strings_of(split, task) -> list[str]:
    return ["".join(task.decode(row)) for row in split.sequences()]


@pytest.mark.parametrize(
    "options",
    [
        {"n_pairs": 2, "max_train_length": 10},
        {"n_pairs": 3, "max_train_length": 20, "test_multipliers": [2, 4]},
    ],
)
def test_every_string_is_balanced_and_its_targets_are_what_may_follow(options):
    task = load_task("dyck", {**options, "train_size": 1500, "eval_size": 300})
    config = task_config("dyck", options)
    assert set(task.splits) == {"train", "iid_valid", "ood_valid"} | {
        f"test_{n}" for n in config.test_lengths
    }
    for name, split in task.splits.items():
        strings = strings_of(split, task)
        for string, targets in zip(strings, split.targets):
            assert reduced(string) == "", (name, string)
            for t in range(len(string)):
                assert {task.classes[k] for k in np.flatnonzero(targets[t])} == allowed_next(
                    string[: t + 1], config.n_pairs
                ), (string, t)
            assert not targets[len(string) :].any()
        lengths = [len(s) for s in strings]
        if name.startswith("test_"):
            assert set(lengths) == {int(name[5:])}
        else:
            assert 2 <= min(lengths) and max(lengths) <= config.max_train_length
    used = set("".join(strings_of(task.splits["test_" + str(config.test_lengths[-1])], task)))
    assert used == set(task.classes), "every bracket pair appears"


def derivation_probability(string: str, p: float, q: float, n_pairs: int) -> float:
    """P(S =>* string) under the grammar, computed directly on the string. The empty string's
    probability is the grammar's fixed point, found by iteration; S S with an empty side puts the
    string's own probability on both sides, solved for it."""
    empty = 0.0
    for _ in range(200):
        empty = (1 - p - q) + q * empty * empty
    table = {"": empty}

    def prob(w: str) -> float:
        if w not in table:
            wrapped = p / n_pairs * prob(w[1:-1]) if w[0] in PAIRS and PAIRS[w[0]] == w[-1] else 0.0
            splits = sum(prob(w[:k]) * prob(w[k:]) for k in range(1, len(w)))
            table[w] = (wrapped + q * splits) / (1 - 2 * q * empty)
        return table[w]

    return prob(string)


def test_strings_of_a_test_length_follow_the_grammar_conditioned_on_that_length():
    n, n_pairs, p, q = 6, 2, 0.5, 0.25
    config = dyck.DyckConfig(n_pairs=n_pairs, p=p, q=q)
    openers = list(PAIRS)[:n_pairs]
    alphabet = [c for o in openers for c in (o, PAIRS[o])]
    words = ["".join(w) for w in itertools.product(alphabet, repeat=n) if reduced("".join(w)) == ""]
    assert len(words) == 5 * 2**3  # Catalan(3) shapes, two bracket types each
    exact = {w: derivation_probability(w, p, q, n_pairs) for w in words}
    weights = dyck.inside(p, q, n)
    assert sum(exact.values()) == pytest.approx(weights[n], rel=1e-9)
    rng = np.random.default_rng(0)
    draws = 20000
    counts = collections.Counter(dyck.draw_of_length(rng, config, n, weights) for _ in range(draws))
    assert set(counts) <= set(words)
    for w in words:  # each frequency within 5 standard errors of its probability
        expected = exact[w] / weights[n]
        assert abs(counts[w] / draws - expected) < 5 * np.sqrt(expected * (1 - expected) / draws), (
            w,
            counts[w] / draws,
            expected,
        )


def test_training_strings_are_the_authors_capped_draws():
    """Lengths 2..L, repeats allowed (Dyck-2 has only 1,618 strings of length 2..10), and the capped
    generator's share of the shortest strings: P(S -> ( S ) with S empty) / P(non-empty)."""
    task = load_task("dyck", {"train_size": 4000, "eval_size": 10})
    lengths = task.splits["train"].lengths
    assert lengths.min() == 2 and lengths.max() == 10 and not (lengths % 2).any()
    assert len({tuple(r) for r in task.splits["train"].tokens}) < 1618
    assert 0.30 < np.mean(lengths == 2) < 0.40  # 0.34 in the 5,000-string set of seed 0


def test_training_strings_are_distinct_where_the_grammar_has_room():
    """The authors' generate_list keeps a string once (marnns: `if sample not in arr`). Dyck-3 at
    L = 20 has 1.1 billion strings, and its 5,000 draws with repeats held 1,926 distinct ones, 27%
    of them of length 2."""
    for n_pairs, longest in ((2, 6), (3, 6), (2, 8)):
        alphabet = [c for o in list(PAIRS)[:n_pairs] for c in (o, PAIRS[o])]
        enumerated = sum(
            reduced("".join(w)) == ""
            for n in range(2, longest + 1, 2)
            for w in itertools.product(alphabet, repeat=n)
        )
        assert dyck.strings_up_to(n_pairs, longest) == enumerated
    assert dyck.strings_up_to(2, 10) == 1618
    task = load_task("dyck", {"n_pairs": 3, "max_train_length": 20, "train_size": 3000, "eval_size": 10})
    train = task.splits["train"]
    assert len({tuple(row[:n]) for row, n in zip(train.tokens, train.lengths)}) == 3000
    assert train.lengths.min() == 2 and train.lengths.max() == 20 and train.lengths.mean() > 12


@pytest.mark.parametrize(
    "options",
    [
        {"n_pairs": 0},
        {"n_pairs": 8},
        {"p": 0.6, "q": 0.4},
        {"q": 0},
        {"max_train_length": 9},
        {"test_multipliers": [0]},
        {"train_size": 0},
    ],
)
def test_bad_options_name_the_key(options):
    key = next(iter(options))
    with pytest.raises(ValueError, match=key):
        task_config("dyck", options)


def direct_stack_rnn(cell, readout, x: torch.Tensor) -> torch.Tensor:
    """The authors' SRNN_Softmax step for one sequence, with plain lists for the stack."""
    rnn = cell.rnn
    h = torch.zeros(rnn.hidden_size, dtype=x.dtype)
    stack = [torch.zeros(cell.stack_dim, dtype=x.dtype) for _ in range(cell.stack_size)]
    out = []
    for x_t in x:
        h_bar = cell.read.weight @ stack[0] + cell.read.bias + h
        h = torch.tanh(rnn.weight_ih @ x_t + rnn.bias_ih + rnn.weight_hh @ h_bar + rnn.bias_hh)
        a = torch.softmax(cell.actions.weight @ h + cell.actions.bias, 0)
        new = torch.sigmoid(cell.element.weight @ h + cell.element.bias)
        pushed, popped = [new] + stack[:-1], stack[1:] + [torch.zeros(cell.stack_dim, dtype=x.dtype)]
        stack = [a[0] * u + a[1] * o for u, o in zip(pushed, popped)]
        out.append(readout.weight @ h + readout.bias)
    return torch.stack(out)


def test_the_stack_rnn_equals_its_equations():
    torch.manual_seed(0)
    task = load_task("dyck", {"train_size": 20, "eval_size": 20})
    net = build_model("stack_rnn", {"stack_size": 7}, task).double()
    split = task.splits["test_20"]
    tokens, lengths = torch.from_numpy(split.tokens[:3]).long(), torch.from_numpy(split.lengths[:3]).long()
    with torch.no_grad():
        batched = net(tokens, lengths)
        for k in range(3):
            x = torch.nn.functional.one_hot(tokens[k], len(task.vocab)).double()
            torch.testing.assert_close(batched[k], direct_stack_rnn(net.cell, net.readout, x))


@pytest.mark.parametrize(
    "model, options",
    [
        ("stack_rnn", {}),
        ("lstm", {"d_model": 8, "dropout": 0.0}),
        ("panm", {"controller": "srnn", "hidden": 8, "pointer_hidden": 32}),
        ("panm", {"controller": "lstm", "hidden": 8}),
        ("panm", {"controller": "gru", "hidden": 16, "mode1_heads": 3, "mode2_heads": 2}),
    ],
)
def test_an_answer_depends_only_on_the_symbols_read_so_far(model, options):
    torch.manual_seed(0)
    task = load_task("dyck", {"train_size": 20, "eval_size": 20})
    net = build_model(model, options, task).eval()
    split = task.splits["test_20"]
    tokens, lengths = torch.from_numpy(split.tokens[:4]).long(), torch.from_numpy(split.lengths[:4]).long()
    with torch.no_grad():
        out = net(tokens, lengths)
        changed = tokens.clone()
        changed[:, 12:] = torch.randint(len(dyck.SPECIAL_TOKENS), len(task.vocab), changed[:, 12:].shape)
        torch.testing.assert_close(net(changed, lengths)[:, :12], out[:, :12])
        assert not torch.allclose(net(changed, lengths)[:, 12:], out[:, 12:])


def test_the_presets_panm_has_the_papers_pointer_units_beside_the_stack_rnns_core():
    """App. C: 256-dimensional GRUs for the Pointer Units "in all experiments"; the Controller's core
    is the stack RNN it is compared with, at marnns's 8 units."""
    from trainables.config import parse_trial_config, preset
    from trainables.steps import make_model

    cfg = parse_trial_config(preset("dyck", "panm"))
    net = make_model(cfg, load_task("dyck", {"train_size": 20, "eval_size": 20}))
    assert [unit.hidden_size for unit in net.pointer_units] == [256, 256]
    assert [keys[-1].out_features for keys in net.address_keys] == [256, 256]
    assert net.controller.rnn.hidden_size == 8


def test_a_sequence_is_right_when_every_position_set_is():
    targets = torch.tensor(
        [[[1, 0, 1, 1], [1, 1, 1, 0], [0, 0, 0, 0]], [[1, 0, 1, 1], [1, 0, 1, 0], [0, 0, 0, 0]]]
    )
    logits = torch.where(targets > 0, 2.0, -2.0)
    logits[1, 1, 1] = 0.5  # one symbol of the second sequence's second position on the wrong side of 0.5
    logits[0, 2] = 5.0  # padding after the first sequence's two positions does not count
    sums = NEXT_SYMBOL_SETS.score_sums(logits, {"targets": targets, "target_lengths": torch.tensor([2, 2])})
    assert sums["seq_acc"].tolist() == [1.0, 2.0] and sums["token_acc"].tolist() == [3.0, 4.0]


def test_losses_of_per_position_outputs_against_their_sums():
    """The Dyck authors' squared error of the sigmoid outputs (MSELoss), and the token cross-entropy
    of the sequence tasks, over the real positions only: a mean over every (position, symbol) and
    every target token of the batch, written out as sums over a loop."""
    torch.manual_seed(0)
    lengths = [3, 1, 4]
    targets = torch.randint(0, 2, (3, 4, 5))
    out = torch.randn(3, 4, 5, dtype=torch.float64)
    squared, cells = 0.0, 0
    for b, length in enumerate(lengths):
        for t in range(length):
            for s in range(5):
                squared += (1 / (1 + math.exp(-out[b, t, s].item())) - targets[b, t, s].item()) ** 2
                cells += 1
    batch = {"targets": targets, "target_lengths": torch.tensor(lengths)}
    assert NEXT_SYMBOL_SETS.loss(out, batch).item() == pytest.approx(
        squared / cells, rel=1e-6
    )  # the losses run in float32

    tokens = torch.randint(0, 5, (3, 4))
    nll, count = 0.0, 0
    for b, length in enumerate(lengths):
        for t in range(length):
            nll -= out[b, t, tokens[b, t]].item() - math.log(sum(math.exp(v) for v in out[b, t].tolist()))
            count += 1
    batch = {"targets": tokens, "target_lengths": torch.tensor(lengths)}
    assert SEQUENCE_TO_SEQUENCE.loss(out, batch).item() == pytest.approx(nll / count, rel=1e-6)


@pytest.mark.long
def test_the_stack_rnn_learns_dyck2_and_is_scored_per_test_length():
    cfg = TrainConfig(
        task="dyck",
        model="stack_rnn",
        task_options={"train_size": 2000, "eval_size": 200},
        optimizer="adam",
        lr=1e-2,
        batch_size=16,
        n_iters=1500,
        eval_every=1500,
        grad_clip=None,
        threads=1,
    )
    metrics = train(cfg, log=None)
    assert metrics["iid_valid_seq_acc_final"] > 0.9, metrics
    assert {f"test_{n}_seq_acc_at_best" for n in (12, 20, 40, 80)} <= set(metrics)


def test_the_reports_pointer_map_reads_panm_on_a_dyck_string(tmp_path):
    from orchestrator.report.maps import activations_of, plot_pointers
    from trainables.config import parse_trial_config
    from trainables.steps import make_model

    config = {
        "task": "dyck",
        "model": "panm",
        "task_options": {"train_size": 20, "eval_size": 5},
        "controller": "srnn",
        "hidden": 8,
    }
    cfg = parse_trial_config(config)
    state = make_model(cfg, load_task(cfg.task, cfg.task_options)).state_dict()
    task, names, caption, activations = activations_of(config, state)
    assert len(names) == 80 and set(names) <= set(
        task.classes
    )  # the longest test string, one slot per symbol
    assert (
        activations["mode1"][0].shape == (1, 2, 80) and activations["mode1"][0][0, :, 1:].sum() == 0
    )  # step 1 sees slot 1 only
    path, _ = plot_pointers("dyck__panm", names, activations, tmp_path)
    assert path.stat().st_size > 0
