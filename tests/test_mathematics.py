"""The mathematics task: every answer of the dataset's generator, as our task stores it, against an
evaluator that reads the question in English and computes the answer itself."""

from __future__ import annotations

import re
from decimal import Decimal

import numpy as np
import pytest

from trainables.tasks import load_task, mathematics, task_config

NUMBER = r"(-?\d+(?:\.\d+)?)"
# add_or_sub's question forms -> the answer from the two numbers in the order they are written.
SUMS = [
    (r"(?:What is |Calculate |Work out )?{a} ?\+ ?{b}[.?]?", lambda a, b: a + b),
    (r"(?:What is |Calculate |Work out )?{a} - {b}[.?]?", lambda a, b: a - b),
    (r"(?:Add|Add together|Put together|Sum|Total of) {a} and {b}\.", lambda a, b: a + b),
    (r"What is {a} plus {b}\?", lambda a, b: a + b),
    (r"What is {a} (?:minus|take away) {b}\?", lambda a, b: a - b),
    (r"What is the (?:difference|distance) between {a} and {b}\?", lambda a, b: abs(a - b)),
    (r"Subtract {a} from {b}\.", lambda a, b: b - a),
    (r"What is {a} less than {b}\?", lambda a, b: b - a),
]
PLACES = [
    "units",
    "tens",
    "hundreds",
    "thousands",
    "ten thousands",
    "hundred thousands",
    "millions",
    "ten millions",
    "hundred millions",
    "billions",
    "ten billions",
    "hundred billions",
]


def evaluate(module: str, question: str) -> Decimal:
    if module == "place_value":
        place, number = re.fullmatch(r"What is the (.+) digit of (\d+)\?", question).groups()
        return Decimal(int(number) // 10 ** PLACES.index(place) % 10)
    for form, answer in SUMS:
        found = re.fullmatch(form.format(a=NUMBER, b=NUMBER), question)
        if found:
            return answer(Decimal(found.group(1)), Decimal(found.group(2)))
    raise AssertionError(f"a question in no known form: {question!r}")


@pytest.mark.parametrize("module", ["add_or_sub", "place_value"])
def test_every_answer_agrees_with_the_evaluator(module):
    task = load_task("mathematics", {"module": module, "train_size": 3000, "eval_size": 1000})
    assert set(task.splits) == {"train", "iid_valid", "ood_valid", "test_interpolate", "test_extrapolate"}
    for name, split in task.splits.items():
        for question, answer in zip(split.sequences(), split.target_sequences()):
            question, answer = "".join(task.decode(question)), task.decode(answer)
            assert answer[-1] == "<eos>", (name, question)
            assert Decimal("".join(answer[:-1])) == evaluate(module, question), (name, question, answer)


def test_extrapolation_asks_about_larger_numbers():
    """The extrapolation set's numbers and questions are longer than the training set's."""
    for module in mathematics.MODULES:
        task = load_task("mathematics", {"module": module, "train_size": 3000, "eval_size": 1000})
        train, extrapolated = task.splits["train"], task.splits["test_extrapolate"]
        assert extrapolated.lengths.mean() > train.lengths.mean() + 4, module
        if module == "add_or_sub":
            assert extrapolated.target_lengths.mean() > train.target_lengths.mean() + 3


def test_the_generator_leaves_the_global_random_states_alone():
    import random

    random.seed(5)
    np.random.seed(5)
    expected = (random.random(), np.random.random())
    random.seed(5)
    np.random.seed(5)
    first = mathematics.draw("train", "add_or_sub", 30, random.Random(0))
    assert (random.random(), np.random.random()) == expected
    assert (
        mathematics.draw("train", "add_or_sub", 30, random.Random(0)) == first
    )  # and is seeded by its own stream


@pytest.mark.parametrize("options", [{"module": "mul"}, {"train_size": 0}, {"eval_size": -1}])
def test_bad_options_name_the_key(options):
    with pytest.raises(ValueError, match=next(iter(options))):
        task_config("mathematics", options)


def test_the_report_finds_table_13_beside_the_extrapolation_column():
    from orchestrator.report.papers import published_for

    config = {
        "task_options": {"module": "place_value"},
        "d_model": 512,
        "universal": True,
        "relative_positions": True,
    }
    grid = {"universal": [False, True], "relative_positions": [False, True]}
    cell = published_for(
        "transformer_enc_dec", "mathematics", None, "test_extrapolate_seq_acc_final", grid, config
    )
    assert (cell["table"], cell["mean"], cell["std"]) == ("Table 13", 0.75, 0.10)
    for other in ("test_seq_acc_final", "test_extrapolate_seq_acc_at_best", "test_interpolate_seq_acc_final"):
        assert published_for("transformer_enc_dec", "mathematics", None, other, grid, config) is None, other
    small = {**config, "d_model": 64}  # a CPU-scale run is not put beside the paper's
    assert (
        published_for(
            "transformer_enc_dec", "mathematics", None, "test_extrapolate_seq_acc_final", grid, small
        )
        is None
    )
