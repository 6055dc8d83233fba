"""Multi30K read from files in the standard layout that the test writes: the length-sorted split
(PANM Sec. 3.4), the training part's vocabulary with <unk>, perplexity against its definition, and
one line when the folder is missing."""

from __future__ import annotations

import math
import random

import pytest
import torch

from trainables.config import TrainConfig
from trainables.evaluation import ratios
from trainables.kinds import TRANSLATION
from trainables.tasks import load_task, multi30k, task_config
from trainables.tasks.base import Task
from trainables.train import train

NOUNS = [("dog", "hund"), ("man", "mann"), ("woman", "frau"), ("ball", "ball"), ("street", "straße")]


@pytest.fixture()
def data(tmp_path):
    return write_sentences(tmp_path)


def write_sentences(tmp_path):
    """Multi30K's three parts in `tmp_path`: 120, 20 and 20 sentences of a few nouns each."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    for part, n in (("train", 120), ("val", 20), ("test_2016_flickr", 20)):
        english, german = [], []
        for _ in range(n):
            chosen = rng.choices(NOUNS, k=rng.randint(1, 6))
            english.append("A " + " and a ".join(e for e, _ in chosen) + ".")
            german.append("Ein " + " und ein ".join(g for _, g in chosen) + ".")
        (tmp_path / f"{part}.en").write_text("\n".join(english) + "\n")
        (tmp_path / f"{part}.de").write_text("\n".join(german) + "\n")
    return tmp_path


def test_length_sorted_split_and_vocabulary(data):
    task = load_task("multi30k", {"data_dir": str(data), "train_fraction": 0.5, "min_count": 3})
    pairs = multi30k.read_pairs(data, ("train", "val", "test_2016_flickr"))
    splits = task.splits
    assert len(splits["train"]) + len(splits["iid_valid"]) + len(splits["test"]) == len(pairs) == 160
    assert (
        len(splits["test"]) == 80
        and max(splits["train"].lengths.max(), splits["iid_valid"].lengths.max())
        <= splits["test"].lengths.min()
    )
    decoded = task.decode(splits["test"].targets[0][: splits["test"].target_lengths[0]])
    assert decoded[0] == "ein" and decoded[-1] == "<eos>"
    assert "<unk>" in task.vocab and "straße" in task.vocab and "hund" in task.vocab


def test_each_sentence_keeps_its_own_translation_through_the_sort(data):
    """Every sample of every split: its German is its English word for word (the writer's
    sentences), so no sort or cut moved a line away from its pair."""
    task = load_task("multi30k", {"data_dir": str(data), "train_fraction": 0.5, "min_count": 1})
    german_of = {"a": "ein", "and": "und", ".": ".", **dict(NOUNS)}
    seen = 0
    for split in ("train", "iid_valid", "test"):
        sp = task.splits[split]
        for k in range(len(sp)):
            english = task.decode(sp.tokens[k][: sp.lengths[k]])
            german = task.decode(sp.targets[k][: sp.target_lengths[k]])
            assert german == [german_of[w] for w in english] + ["<eos>"], (split, k, english, german)
            seen += 1
    assert seen == 160


def test_perplexity_is_e_to_the_mean_negative_log_likelihood():
    """Over every target token of every sentence (padding excluded), computed token by token."""
    torch.manual_seed(0)
    logits = torch.randn(3, 5, 7, dtype=torch.float64)
    targets = torch.randint(0, 7, (3, 5))
    lengths = torch.tensor([5, 2, 4])
    got = ratios(TRANSLATION.score_sums(logits, {"targets": targets, "target_lengths": lengths}))
    nll, right, count = 0.0, 0, 0
    for b in range(3):
        for t in range(int(lengths[b])):
            probabilities = [math.exp(v) for v in logits[b, t].tolist()]
            nll -= math.log(probabilities[int(targets[b, t])] / sum(probabilities))
            right += int(max(range(7), key=lambda k: probabilities[k]) == int(targets[b, t]))
            count += 1
    assert got["perplexity"] == pytest.approx(math.exp(nll / count))
    assert got["token_acc"] == pytest.approx(right / count)
    assert Task("multi30k", TRANSLATION, {}, vocab=["a"] * 9).chance().endswith("perplexity 9")


def test_a_missing_folder_or_file_is_one_line(tmp_path, monkeypatch):
    monkeypatch.delenv("MULTI30K_DATA", raising=False)
    with pytest.raises(ValueError, match=r"data_dir: '\$MULTI30K_DATA' names an unset environment variable"):
        task_config("multi30k", {})
    (tmp_path / "train.en").write_text("A dog.\n")
    with pytest.raises(ValueError, match=r"has no train.de \(5 of the 6 files"):
        task_config("multi30k", {"data_dir": str(tmp_path)})


def test_models_train_and_score_perplexity(data):
    for model, options in (
        ("transformer_enc_dec", {}),
        ("transformer_enc_dec_panm", {"hidden": 16, "mlp_hidden": 16}),
    ):
        cfg = TrainConfig(
            task="multi30k",
            model=model,
            task_options={"data_dir": str(data)},
            optimizer="adam",
            lr=1e-3,
            batch_size=16,
            n_iters=30,
            eval_every=10,
            grad_clip=1.0,
            threads=1,
            model_options={
                "d_model": 32,
                "n_heads": 4,
                "encoder_layers": 1,
                "decoder_layers": 2,
                "dropout": 0.0,
                **options,
            },
        )
        metrics = train(cfg, log=None)
        assert (
            1 < metrics["test_perplexity_final"] < len(load_task("multi30k", {"data_dir": str(data)}).vocab)
        ), model
        # Three evaluations: the best checkpoint is the one of lowest perplexity, not of highest.
        assert metrics["best_ood_valid_perplexity"] <= metrics["iid_valid_perplexity_final"] + 1e-9


def test_every_score_of_a_trial_reaches_mlflow():
    """Perplexity's metrics were once dropped on the way to the store (a list of suffixes without it)."""
    from orchestrator.record.runs import numeric_metrics

    result = {
        "best_ood_valid_perplexity": 3.2,
        "iid_valid_perplexity": 3.0,
        "train_token_acc": 0.5,
        "done": True,
        "trial_id": "x",
    }
    assert numeric_metrics(result) == {
        "best_ood_valid_perplexity": 3.2,
        "iid_valid_perplexity": 3.0,
        "train_token_acc": 0.5,
    }
