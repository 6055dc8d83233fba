"""Multi30K English-to-German translation as the PANM paper runs it (Sec. 3.4, Fig. 3b), read from
the standard text files, which this service cannot download: `data_dir` (default `$MULTI30K_DATA`)
holds `<part>.en` and `<part>.de`, one sentence a line, for each of `parts` (task 1's train, val
and test_2016_flickr: 29,000 + 1,014 + 1,000 pairs, "the 30K-sample dataset").

The pairs of all parts together are sorted by the English sentence's length (stable) and split:
the shortest `train_fraction` (the paper's 0.8 and 0.5) is trained on, the rest, longer, is the
test set; a random `iid_fraction` of the training part fills both validation slots. Sentences are
lower-cased and split into words and punctuation; one vocabulary holds both languages' words seen
`min_count` times in the training part, the others read as <unk>. The paper reports perplexity
under teacher forcing (kind `translation`: `*_perplexity`, lower is better, and `*_token_acc`); it
prints no numbers (Fig. 3b only). The tokenisation and vocabulary are ours (the paper is silent,
the authors' code has no Multi30K).
"""

from __future__ import annotations

import functools
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..kinds import TRANSLATION
from .base import (
    SPECIAL_TOKENS,
    Task,
    check_user_folder,
    check_values,
    decoder_split,
    held_out_splits,
    hold_out,
    length_split,
    user_folder,
)

KIND = TRANSLATION  # the probe's and the registry's (tasks.TASKS)

UNK = "<unk>"
WORD = re.compile(r"\w+|[^\w\s]")


@dataclass(frozen=True)
class Multi30kConfig:
    data_dir: str = "$MULTI30K_DATA"
    parts: tuple[str, ...] = ("train", "val", "test_2016_flickr")
    train_fraction: float = 0.8
    iid_fraction: float = 0.1
    min_count: int = 2
    eval_size: int | None = None  # at most this many pairs per evaluation set, drawn at random (None: all)
    seed: int = 0  # which training pairs the IID hold-out takes

    def __post_init__(self):
        check_values(self)

    def check(self) -> None:
        if not (
            isinstance(self.parts, tuple) and self.parts and all(isinstance(p, str) and p for p in self.parts)
        ):
            raise ValueError(
                "parts: expected a list of file stems such as train, val, test_2016_flickr, "
                f"got {self.parts!r}"
            )
        folder = check_user_folder(self.data_dir, "Multi30K's train.en, train.de, ...")
        missing = [
            f"{p}.{lang}"
            for p in self.parts
            for lang in ("en", "de")
            if not (folder / f"{p}.{lang}").is_file()
        ]
        if missing:
            raise ValueError(
                f"data_dir: {str(folder)!r} has no {missing[0]} "
                f"({len(missing)} of the {2 * len(self.parts)} files `parts` names are missing)"
            )

    @property
    def folder(self) -> Path:
        return user_folder(self.data_dir)


def words(text: str) -> list[str]:
    return WORD.findall(text.lower())


@functools.lru_cache(maxsize=4)
def read_pairs(folder: Path, parts: tuple[str, ...]) -> list[tuple[list[str], list[str]]]:
    """(English words, German words) per line of every part, in file order."""
    pairs = []
    for part in parts:
        english, german = (
            (folder / f"{part}.{lang}").read_text(encoding="utf-8").splitlines() for lang in ("en", "de")
        )
        if len(english) != len(german):
            raise ValueError(
                f"{folder / part}.en has {len(english)} lines and {part}.de {len(german)}: "
                "a line each per pair"
            )
        pairs += [(words(e), words(g)) for e, g in zip(english, german)]
    return pairs


def split_pairs(config: Multi30kConfig) -> tuple[list, list]:
    """(the training part, the test part): every pair sorted by the English length, then cut."""
    return length_split(read_pairs(config.folder, config.parts), config.train_fraction)


def with_vocabulary(train: list, config: Multi30kConfig) -> Task:
    """The task without data: its vocabulary, the words of the training part seen `min_count` times."""
    counts = Counter(w for source, target in train for w in source + target)
    known = sorted(w for w, n in counts.items() if n >= config.min_count)
    return Task(name="multi30k", kind=KIND, splits={}, vocab=SPECIAL_TOKENS + [UNK] + known, classes=known)


def probe(config: Multi30kConfig) -> Task:
    """What a model is built from."""
    return with_vocabulary(split_pairs(config)[0], config)


def build(config: Multi30kConfig) -> Task:
    shorter, test = split_pairs(config)
    task = with_vocabulary(shorter, config)
    known = set(task.vocab)
    rng = np.random.default_rng(config.seed)
    train, held = hold_out(shorter, config.iid_fraction, rng)

    def split(pairs: list):
        mapped = [
            ([w if w in known else UNK for w in s], [w if w in known else UNK for w in t]) for s, t in pairs
        ]
        return decoder_split(mapped, task.vocab, [len(s) for s, _ in pairs])

    return held_out_splits(task, split, (train, held, test), config.eval_size, rng)


def load(config: Multi30kConfig) -> Task:
    return build(config)
