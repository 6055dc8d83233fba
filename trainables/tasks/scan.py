"""SCAN (Lake & Baroni, 2018), generated from its grammar and interpretation rules, with the
length cut-off splits of Newman et al. (2020) as Csordás et al. (2021) build them
(`dataset/scan_length_resplit.py` of their code, which the Compositional Attention paper, Sec. 4.6 and
App. C.6, and the PANM paper, Sec. 3.3 and App. D.3, both use).

Grammar (every command of it, 20,910, appears once):
  C -> S and S | S after S | S          S -> V twice | V thrice | V
  V -> X opposite Y | X around Y | X Y | U      (X: a primitive U or "turn"; Y: left or right)
  U -> walk | look | run | jump
Interpretation: [[walk]] = I_WALK (and so on), [[turn Y]] = I_TURN_Y, [[u Y]] = I_TURN_Y [[u]],
[[X opposite Y]] = I_TURN_Y I_TURN_Y [[u]] (nothing more for turn), [[X around Y]] = (I_TURN_Y [[u]]) x 4,
[[V twice]] = [[V]] [[V]], thrice three times, [[S1 and S2]] = [[S1]] [[S2]], [[S1 after S2]] = [[S2]] [[S1]].

Splits for a cut-off L (`length_cutoff`, the papers' 22, 24, ..., 40): every command whose action
sequence is longer than L is the test set (3,920 at L = 22, PANM App. D.3); of the others, a random
10% (`iid_fraction`) is held out as IID validation and the rest trained on (15,291 at L = 22; PANM's
appendix quotes all 16,990, the original length split's training set, but the authors' code holds
out the 10%). Both papers report the final model on the test set (no selection): `test_seq_acc_final`.
There is no OOD validation set: the IID hold-out fills both validation slots. `eval_size` caps the
evaluation sets (a random subset) where greedy decoding of all of them costs too much (CPU-scale
checks, tests). Targets end in <eos>; a sample's depth is its number of actions.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass

import numpy as np

from ..kinds import AUTOREGRESSIVE_SEQ2SEQ
from .base import (
    SPECIAL_TOKENS,
    Split,
    Task,
    cached,
    check_values,
    decoder_split,
    held_out_splits,
    hold_out,
)

KIND = AUTOREGRESSIVE_SEQ2SEQ  # the probe's and the registry's (tasks.TASKS)

PRIMITIVES = {"walk": "I_WALK", "look": "I_LOOK", "run": "I_RUN", "jump": "I_JUMP"}
TURNS = {"left": "I_TURN_LEFT", "right": "I_TURN_RIGHT"}
REPEATS = {"twice": 2, "thrice": 3}
WORDS = [*PRIMITIVES, "turn", *TURNS, "opposite", "around", *REPEATS, "and", "after"]
ACTIONS = [*PRIMITIVES.values(), *TURNS.values()]
VOCAB = SPECIAL_TOKENS + WORDS + ACTIONS
LONGEST = 48  # "jump around left thrice and walk around right thrice": 24 + 24 actions


@dataclass(frozen=True)
class ScanConfig:
    seed: int = 0  # which commands the IID hold-out takes
    length_cutoff: int = 22
    iid_fraction: float = 0.1
    # at most this many commands per evaluation set, drawn at random (None: all, as the papers)
    eval_size: int | None = None

    def __post_init__(self):
        check_values(self)

    def check(self) -> None:
        if not 1 <= self.length_cutoff < LONGEST:
            raise ValueError(
                f"length_cutoff: must be 1..{LONGEST - 1} (actions in a training command; "
                f"the longest command has {LONGEST}), got {self.length_cutoff!r}"
            )


def verb_phrases() -> list[tuple[list[str], list[str]]]:
    """Every V with its actions."""
    out = [([u], [a]) for u, a in PRIMITIVES.items()]
    for x, y in itertools.product([*PRIMITIVES, "turn"], TURNS):
        turn, act = TURNS[y], [PRIMITIVES[x]] if x in PRIMITIVES else []
        out.append(([x, y], [turn] + act))
        out.append(([x, "opposite", y], [turn, turn] + act))
        out.append(([x, "around", y], ([turn] + act) * 4))
    return out


def commands() -> list[tuple[list[str], list[str]]]:
    """Every command of the grammar with its actions, in a fixed order."""
    sentences = [(v, a) for v, a in verb_phrases()]
    sentences += [(v + [word], a * times) for word, times in REPEATS.items() for v, a in verb_phrases()]
    out = list(sentences)
    for (first, first_actions), (second, second_actions) in itertools.product(sentences, sentences):
        out.append((first + ["and"] + second, first_actions + second_actions))
        out.append((first + ["after"] + second, second_actions + first_actions))
    return out


def make_split(pairs: list[tuple[list[str], list[str]]]) -> Split:
    return decoder_split(pairs, VOCAB, [len(actions) for _, actions in pairs])


def probe(config: ScanConfig) -> Task:
    """The task without its data: what a model is built from."""
    return Task(name="scan", kind=KIND, splits={}, vocab=VOCAB, classes=ACTIONS)


def build(config: ScanConfig) -> Task:
    everything = commands()
    short = [p for p in everything if len(p[1]) <= config.length_cutoff]
    rng = np.random.default_rng(config.seed)
    train, held = hold_out(short, config.iid_fraction, rng)
    longer = [p for p in everything if len(p[1]) > config.length_cutoff]
    return held_out_splits(probe(config), make_split, (train, held, longer), config.eval_size, rng)


def load(config: ScanConfig) -> Task:
    return cached("scan", config, functools.partial(build, config))
