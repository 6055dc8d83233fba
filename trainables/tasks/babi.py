"""bAbI question answering (Weston et al., 2015) as the PANM paper runs it (Sec. 3.4, App. D.4, Table
3), read from the standard files, which this service cannot download: `data_dir` is the folder
holding `qa1_*_train.txt` ... `qa20_*_test.txt` (e.g. `tasks_1-20_v1-2/en-10k`; a `$VARIABLE` in
it is expanded from the environment). Every node that runs a trial must see the folder.

The format: numbered lines, a story restarting at 1; a statement is text, a question is its text, a
tab, the answer (comma-separated words for the list tasks) and a tab with the supporting lines. A
sample is one question: its input the story's statements so far, then the question, lower-cased
and split into words and punctuation; its output the answer's words, then <eos>.

Splits (App. D.4): per task, train, valid and test files together, sorted by the length of the
context (stable, so file order breaks ties); the shortest `train_fraction` (the paper's 0.8 and
0.5) is trained on and the rest is the test set, longer by construction. All 20 tasks are trained
jointly; a sample's depth is its task's number. The paper tests the model after 100 epochs (no
selection: `test_seq_acc_final`, exact match of the whole answer) and trains on its whole training
part: a random `iid_fraction` of that part fills both validation slots and is trained on too (it
shows the fit, and selects nothing the paper's number reads). `hold_out_validation: true` leaves it
out of training, as SCAN's authors do; it cost the model a tenth of Table 3's training data.
Parsed once per process (seconds) and never cached on disk, so a new process always reads the
files as they are.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..kinds import AUTOREGRESSIVE_SEQ2SEQ
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

KIND = AUTOREGRESSIVE_SEQ2SEQ  # the probe's and the registry's (tasks.TASKS)

TASK_NUMBERS = tuple(range(1, 21))
WORD = re.compile(r"[a-z0-9']+|[^\sa-z0-9']")

Sample = tuple[list[str], list[str]]  # (context and question words, answer words)


@dataclass(frozen=True)
class BabiConfig:
    data_dir: str = "$BABI_DATA"
    train_fraction: float = 0.8
    tasks: tuple[int, ...] = TASK_NUMBERS
    iid_fraction: float = 0.1  # the validation questions' share of the training part
    hold_out_validation: bool = False  # true: not trained on (the paper trains on the whole training part)
    # at most this many questions per evaluation set, drawn at random (None: all)
    eval_size: int | None = None
    seed: int = 0  # which training questions the validation set takes

    def __post_init__(self):
        check_values(self)

    def check(self) -> None:
        if not set(self.tasks) <= set(TASK_NUMBERS):
            raise ValueError(f"tasks: bAbI's tasks are 1..20, got {list(self.tasks)}")
        folder = check_user_folder(self.data_dir, "bAbI's qa1_*_train.txt ... qa20_*_test.txt")
        missing = [k for k in self.tasks if not task_files(folder, k)]
        if missing:
            raise ValueError(
                f"data_dir: {str(folder)!r} has no qa{missing[0]}_*_{{train,valid,test}}.txt "
                f"({len(missing)} of the tasks asked for are missing)"
            )

    @property
    def folder(self) -> Path:
        return user_folder(self.data_dir)


def task_files(folder: Path, number: int) -> list[Path]:
    return sorted(p for part in ("train", "valid", "test") for p in folder.glob(f"qa{number}_*_{part}.txt"))


def words(text: str) -> list[str]:
    return WORD.findall(text.lower())


def read_questions(path: Path) -> list[Sample]:
    """Every question of one file, with the statements of its story before it."""
    samples: list[Sample] = []
    story: list[str] = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        number, _, text = line.partition(" ")
        if not number.isdigit():
            raise ValueError(f"{path}:{n}: expected a line number first, got {line[:40]!r}")
        if number == "1":
            story = []
        if "\t" in text:
            question, answer = text.split("\t")[:2]
            samples.append((story + words(question), [w for w in answer.strip().lower().split(",") if w]))
        else:
            story = story + words(text)
    return samples


@functools.lru_cache(maxsize=4)
def read_tasks(folder: Path, numbers: tuple[int, ...]) -> dict[int, list[Sample]]:
    return {k: [s for path in task_files(folder, k) for s in read_questions(path)] for k in numbers}


def probe(config: BabiConfig) -> Task:
    """The task's vocabulary needs the files: a model is built from it."""
    questions = read_tasks(config.folder, config.tasks)
    inputs = sorted({w for samples in questions.values() for source, _ in samples for w in source})
    answers = sorted({w for samples in questions.values() for _, target in samples for w in target})
    return Task(
        name="babi",
        kind=KIND,
        splits={},
        vocab=SPECIAL_TOKENS + sorted(set(inputs) | set(answers)),
        classes=answers,
    )


def build(config: BabiConfig) -> Task:
    task = probe(config)
    rng = np.random.default_rng(config.seed)
    train, held_out, test = [], [], []
    for number, samples in read_tasks(config.folder, config.tasks).items():
        shorter, longer = length_split(samples, config.train_fraction)
        part = [(s, number) for s in shorter]
        kept, held = hold_out(part, config.iid_fraction, rng)
        train += kept if config.hold_out_validation else part
        held_out += held
        test += [(s, number) for s in longer]

    def split(rows: list):
        return decoder_split([s for s, _ in rows], task.vocab, [n for _, n in rows])

    return held_out_splits(task, split, (train, held_out, test), config.eval_size, rng)


def load(config: BabiConfig) -> Task:
    return build(config)
