"""bAbI read from files in the standard format that the test writes: questions with their stories,
answers of one word or a list, the length-sorted split of PANM App. D.4, and one line when the
folder is missing, in a launch as in a trial."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import yaml

from orchestrator.cli.process import main
from trainables.config import TrainConfig
from trainables.tasks import babi, load_task, task_config
from trainables.train import train

PEOPLE, PLACES, THINGS = (
    ["Mary", "John", "Sandra", "Daniel"],
    ["kitchen", "garden", "hallway", "office"],
    ["apple", "football", "milk"],
)


def write_task(
    folder: Path, number: int, name: str, part: str, stories: int, rng: random.Random
) -> list[tuple[list[str], list[str]]]:
    """Stories of 1..6 moves, a question after every second one: "Where is X?" (qa1) or "What is X
    carrying?" (qa8, a list answer, 'nothing' when empty), in the files' own layout. -> each
    question's (words of its story's statements so far, then of the question; its answer's words)."""
    lines, samples = [], []
    split = lambda text: text.lower().replace(".", " .").replace("?", " ?").split()  # noqa: E731
    for _ in range(stories):
        where, carrying, n, story = {}, {p: [] for p in PEOPLE}, 0, []
        for move in range(rng.randint(1, 6)):
            person = rng.choice(PEOPLE)
            n += 1
            if number == 8 and rng.random() < 0.5:
                thing = rng.choice(THINGS)
                carrying[person].append(thing)
                statement = f"{person} picked up the {thing}."
            else:
                where[person] = rng.choice(PLACES)
                statement = f"{person} went to the {where[person]}."
            lines.append(f"{n} {statement}")
            story += split(statement)
            if move % 2 == 1:
                n += 1
                question, answer = (
                    (f"Where is {person}?", where.get(person, "nowhere"))
                    if number == 1
                    else (f"What is {person} carrying?", ",".join(carrying[person]) or "nothing")
                )
                lines.append(f"{n} {question}{' ' if number == 1 else ''}\t{answer}\t{n - 1}")
                samples.append((story + split(question), answer.lower().split(",")))
    (folder / f"qa{number}_{name}_{part}.txt").write_text("\n".join(lines) + "\n")
    return samples


@pytest.fixture()
def data(tmp_path):
    folder = tmp_path / "en-10k"
    folder.mkdir()
    rng = random.Random(0)
    for number, name in ((1, "single-supporting-fact"), (8, "lists-sets")):
        for part, stories in (("train", 60), ("test", 20)):
            write_task(folder, number, name, part, stories, rng)
    return folder


def test_questions_with_their_stories(data):
    samples = babi.read_questions(data / "qa8_lists-sets_train.txt")
    first_story = (data / "qa8_lists-sets_train.txt").read_text().split("\n1 ")[0].splitlines()
    question = next(line for line in first_story if "\t" in line)
    source, answer = samples[0]
    assert source[-1] == "?" and source[-5:-1] == babi.words(question.split(" ", 1)[1].split("\t")[0])[:-1]
    assert answer == [w for w in question.split("\t")[1].split(",")]
    assert any(len(target) > 1 for _, target in samples), "a list answer is several words"


def test_every_question_reads_its_own_story_and_no_other(tmp_path):
    """Against the writer's own account of what it wrote: each question's source is its story's
    statements up to it (no question, nothing of an earlier story), then the question."""
    for number in (1, 8):
        written = write_task(tmp_path, number, "t", "train", 40, random.Random(number))
        assert babi.read_questions(tmp_path / f"qa{number}_t_train.txt") == written


def test_length_sorted_split_per_task(data):
    """The paper trains on the whole shorter part (App. D.4: no validation set); the validation
    questions are some of those, unless held out."""
    everything = babi.read_tasks(data, (1, 8))
    for held_out in (False, True):
        task = load_task(
            "babi",
            {"data_dir": str(data), "tasks": [1, 8], "train_fraction": 0.5, "hold_out_validation": held_out},
        )

        def rows(split: str, number: int) -> list[tuple]:
            s = task.splits[split]
            return [tuple(t[:n]) for t, n, d in zip(s.tokens, s.lengths, s.depths) if d == number]

        for number in (1, 8):
            train, valid, test = rows("train", number), rows("iid_valid", number), rows("test", number)
            assert len(test) == len(everything[number]) - round(0.5 * len(everything[number]))
            assert len(train) + len(test) + (len(valid) if held_out else 0) == len(everything[number])
            assert valid and (not set(valid) & set(train) if held_out else set(valid) <= set(train))
            assert max(len(r) for r in train + valid) <= min(len(r) for r in test)
    decoded = task.decode(task.splits["test"].targets[0][: task.splits["test"].target_lengths[0]])
    assert decoded[-1] == "<eos>" and set(decoded[:-1]) <= set(task.classes)


def test_a_missing_folder_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("BABI_DATA", raising=False)
    with pytest.raises(
        ValueError,
        match=r"data_dir: '\$BABI_DATA' names an unset environment variable: set it to the "
        r"folder holding bAbI's qa1_",
    ):
        task_config("babi", {})
    with pytest.raises(ValueError, match="has no qa2_"):
        task_config("babi", {"data_dir": str(tmp_path), "tasks": [2]})
    spec = tmp_path / "babi.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "name": "babi-missing",
                "metric": "best_ood_valid_seq_acc",
                "tasks": [{"task": "babi", "options": {"data_dir": str(tmp_path / "nowhere")}}],
                "models": ["transformer_enc_dec"],
                "seeds": [0],
                "tracking": {"uri": f"sqlite:///{tmp_path}/m.db"},
            }
        )
    )
    assert main(["launch", str(spec), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "tasks[0].options: data_dir: no folder" in err[0]
    assert not (tmp_path / "m.db").exists()


def test_the_environment_names_the_folder_and_a_model_trains(data, monkeypatch):
    monkeypatch.setenv("BABI_DATA", str(data))
    cfg = TrainConfig(
        task="babi",
        model="transformer_enc_dec_panm",
        task_options={"tasks": [1, 8]},
        optimizer="adam",
        lr=1e-3,
        batch_size=16,
        n_iters=4,
        eval_every=2,
        grad_clip=None,
        threads=1,
        model_options={
            "d_model": 32,
            "n_heads": 4,
            "encoder_layers": 1,
            "decoder_layers": 2,
            "hidden": 16,
            "mlp_hidden": 16,
        },
    )
    metrics = train(cfg, log=None)
    assert 0 <= metrics["test_seq_acc_final"] <= 1
