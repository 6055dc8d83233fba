"""Task kinds: what a kind of task hands a model, and how its output is read.

One object per kind owns all of it: the call a model of the kind answers (`predict`), the training
loss, the score sums of an evaluation, the scores and which one selects checkpoints (the first),
what guessing scores, and how a map of a model's attention names an example (`legend`). A task
names its kind (tasks.base.Task.kind), a model the kinds it reads (models.ModelSpec.kinds), and
nothing else asks which kind it is.

Score sums are (sum, count) pairs per score: a split's score is the sum of sums over the sum of
counts. Means over target tokens are masked sums, not out[mask]: a shape that depends on the data
would stop a CUDA graph's capture (graphs.py).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    Batch = dict[str, torch.Tensor]


def _torch():
    """torch, imported at a kind's first tensor call (a step, an evaluation, a map): what a plan and
    the commands that read a launch ask of a kind (its name, scores, forward, chance) go without
    torch's seconds of imports."""
    import torch  # noqa: PLC0415 - see the docstring

    return torch


def count(n: int, like: torch.Tensor) -> torch.Tensor:
    """`n` as a float tensor on `like`'s device, made by a kernel (a copy from the host would stop a
    capture)."""
    return _torch().full((), float(n), device=like.device)


def target_mask(batch: Batch) -> torch.Tensor:
    torch = _torch()
    positions = torch.arange(batch["targets"].shape[1], device=batch["targets"].device)
    return positions[None] < batch["target_lengths"][:, None]


def token_losses(out: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Each target position's cross-entropy, (batch, positions)."""
    losses = _torch().nn.functional.cross_entropy(
        out.float().flatten(0, -2), targets.flatten(), reduction="none"
    )
    return losses.view_as(targets)


def position_accuracy(correct: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """Token accuracy over the target positions `mask` keeps, and exact-sequence accuracy, as sums."""
    torch = _torch()
    token_acc = torch.stack([(correct & mask).sum().float(), mask.sum().float()])
    seq_acc = torch.stack([(correct | ~mask).all(-1).sum().float(), count(len(correct), correct)])
    return {"token_acc": token_acc, "seq_acc": seq_acc}


class Kind:
    """A kind of task. `scores`: what an evaluation reports, the first being the papers' number,
    which selects checkpoints. `forward`: the arguments a model's forward takes, for its docs and
    the check of a model brought from outside the package (models.resolve)."""

    name: str
    scores: tuple[str, ...]
    forward: tuple[str, ...]
    per_depth = False  # scored at each depth (a split's generalization curve): the classification kinds
    decodes = False  # evaluation calls the model once per output position (greedy decoding)
    selected_per_depth = False  # a checkpoint per depth as well (Sort-of-CLEVR's question types)

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"<kind {self.name}>"

    def __reduce__(self):  # unpickled as the one object of its name: models look kinds up by identity
        return kind_named, (self.name,)

    @property
    def metric(self) -> str:
        return self.scores[0]

    def predict(self, model, batch: Batch, **extra) -> torch.Tensor:
        """The model's output on `batch`; `extra` goes to its forward as it is (return_activations)."""
        raise NotImplementedError

    def example(self, split) -> int:
        """The row a picture of the model's activations shows: the longest input."""
        return int(split.lengths.argmax())

    def symbols(self, task, split, row: int) -> list[str]:
        """Row `row`'s input symbols, of a kind that reads tokens (the slots of PANM's memory)."""
        return [str(t) for t in task.decode(split.tokens[row, : split.lengths[row]].tolist())]

    def legend(self, task, split, row: int, width: int) -> tuple[list[str], str]:
        """A map of a Transformer's attention over row `row` of `split`, `width` positions wide: the
        names of its columns and the row in words, its caption (report.maps). A token input's by
        default: the symbols between the <bos> and <eos> the encoder adds."""
        symbols = self.symbols(task, split, row)
        return ["<bos>", *symbols, "<eos>"], " ".join(symbols)

    def loss(self, out: torch.Tensor, batch: Batch) -> torch.Tensor:
        raise NotImplementedError

    def score_sums(self, out: torch.Tensor, batch: Batch) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def correct(self, out: torch.Tensor, batch: Batch) -> torch.Tensor:
        """Whether each sample's answer is right, where the kind is scored per depth."""
        raise NotImplementedError

    def chance(self, task, score: str) -> str:
        """What guessing scores on `score`, in words ending in the number."""
        if score == "rel_l1":
            return "predicting zero: rel_l1 1.0"
        if score == "l1":
            return "predicting zero: l1 of each set's own targets (rel_l1 1.0)"
        if score == "perplexity":
            return f"a uniform guess over the vocabulary: perplexity {len(task.vocab)}"
        if score == "seq_acc":
            return "a guess matching a whole sequence: 0.0"
        return f"uniform guess: {1 / (task.n_classes or len(task.vocab)):.3f}"


class Classification(Kind):
    """One answer class per sample: `labels`, scored by accuracy, at every depth too."""

    scores = ("acc",)
    per_depth = True

    def loss(self, out, batch):
        return _torch().nn.functional.cross_entropy(out.float(), batch["labels"])

    def correct(self, out, batch):
        return out.argmax(-1) == batch["labels"]

    def score_sums(self, out, batch):
        correct = self.correct(out, batch).sum().float()
        return {"acc": _torch().stack([correct, count(len(batch["labels"]), correct)])}


class SequenceClassification(Classification):
    name, forward = "sequence_classification", ("tokens", "lengths")

    def predict(self, model, batch, **extra):
        return model(batch["tokens"], batch["lengths"], **extra)


def patches(width: int) -> list[str]:
    """The columns of an image model's attention, `width` wide: its summary token, then its square
    grid of patches by row and column."""
    side = round(math.sqrt(width - 1))
    return ["summary", *(f"r{r + 1}c{c + 1}" for r in range(side) for c in range(side))]


def answer(task, split, row: int) -> str:
    return task.classes[split.labels[row]]


class ImageQuestion(Classification):
    """A question about an image (Sort-of-CLEVR), whose question types are its depths."""

    def example(self, split):  # a ternary question where there is one
        return int(split.depths.argmax())

    name, forward = "visual_question_answering", ("images", "questions")
    selected_per_depth = True  # the authors keep a checkpoint per question type (Sort-of-CLEVR/main.py)

    def predict(self, model, batch, **extra):
        return model(batch["images"], batch["questions"], **extra)

    def legend(self, task, split, row, width):
        return patches(width), task.describe(split.questions[row])


class ImageClassification(Classification):
    """An image (B, H, W, channels) and one class."""

    name, forward = "image_classification", ("images",)

    def example(self, split):  # an image of the deepest
        return int(split.depths.argmax())

    def predict(self, model, batch, **extra):
        return model(batch["images"], **extra)

    def legend(self, task, split, row, width):
        return patches(width), f"a test image, answer: {answer(task, split, row)}"


class ImageSequenceClassification(ImageClassification):
    """A sequence of images (B, T, H, W, channels), each an object, and one class (the ESBN tasks)."""

    name = "image_sequence_classification"

    def example(self, split):  # the first sequence of images
        return 0

    def legend(self, task, split, row, width):  # the objects by position and id
        names = [f"{k + 1}: object {i}" for k, i in enumerate(split.image_ids[row].tolist())]
        return names, f"a test trial, answer: {answer(task, split, row)}"


class SequenceOutput(Kind):
    """An output token per target position: `targets` and `target_lengths`."""

    def loss(self, out, batch):
        mask = target_mask(batch)
        return (token_losses(out, batch["targets"]) * mask).sum() / mask.sum()

    def score_sums(self, out, batch):
        """Token accuracy pools every target token of the split, so long sequences weigh more, as the
        PANM authors' per-token error rate does; a sequence is right when all its tokens are."""
        return position_accuracy(out.argmax(-1) == batch["targets"], target_mask(batch))


class SequenceToSequence(SequenceOutput):
    """An output sequence read off the input at once (PANM's algorithmic tasks)."""

    name, scores = "sequence_to_sequence", ("token_acc", "seq_acc")
    forward = ("tokens", "lengths", "n_out", "token_features", "target_lengths")

    def predict(self, model, batch, **extra):
        targets = batch["targets"]
        return model(
            batch["tokens"],
            batch["lengths"],
            targets.shape[1],
            batch.get("token_features"),
            batch["target_lengths"],
            **extra,
        )


class AutoregressiveSeq2Seq(SequenceOutput):
    """A decoder generates token by token: teacher forcing in training; in evaluation it reads its
    own outputs (exact match, the SCAN papers' number, then token accuracy)."""

    name, scores = "autoregressive_seq2seq", ("seq_acc", "token_acc")
    forward = ("tokens", "lengths", "n_out", "targets")
    decodes = True

    def predict(self, model, batch, **extra):
        targets = batch["targets"]
        return model(
            batch["tokens"], batch["lengths"], targets.shape[1], targets if model.training else None, **extra
        )


class Translation(SequenceOutput):
    """A translation read under teacher forcing always: perplexity scores the reference's tokens."""

    name, scores = "translation", ("perplexity", "token_acc")
    forward = ("tokens", "lengths", "n_out", "targets")

    def predict(self, model, batch, **extra):
        return model(batch["tokens"], batch["lengths"], batch["targets"].shape[1], batch["targets"], **extra)

    def score_sums(self, out, batch):
        # perplexity: e to the mean negative log-likelihood of the target tokens (evaluation.ratios)
        torch = _torch()
        mask = target_mask(batch)
        nll = (token_losses(out, batch["targets"]) * mask).sum()
        return {
            "perplexity": torch.stack([nll, mask.sum().float()]),
            "token_acc": position_accuracy(out.argmax(-1) == batch["targets"], mask)["token_acc"],
        }


class NextSymbolSets(Kind):
    """The set of symbols that may come next after each input position, multi-hot (Dyck): a position
    is right when each symbol's sigmoid is on the right side of 0.5, a sequence when all are."""

    name, scores, forward = "next_symbol_sets", ("seq_acc", "token_acc"), ("tokens", "lengths")

    def predict(self, model, batch, **extra):
        return model(batch["tokens"], batch["lengths"], **extra)

    def loss(self, out, batch):  # the Dyck authors' squared error of the sigmoid outputs
        mask = target_mask(batch)
        squared = (_torch().sigmoid(out.float()) - batch["targets"].float()) ** 2
        return (squared * mask[..., None]).sum() / (mask.sum() * squared.shape[-1])

    def score_sums(self, out, batch):
        return position_accuracy(((out >= 0) == (batch["targets"] > 0)).all(-1), target_mask(batch))

    def chance(self, task, score):
        if score == "seq_acc":
            return super().chance(task, score)
        return f"random bits: {0.5**task.n_classes:.3f}"  # all n_classes bits right, not 1 of n_classes


class SetRegression(Kind):
    """A scalar per set element: L1 error, then L1 relative to predicting zero (lower is better)."""

    name, scores, forward = "set_regression", ("l1", "rel_l1"), ("features",)

    def predict(self, model, batch, **extra):
        return model(batch["features"], **extra)

    def loss(self, out, batch):
        return (out.float() - batch["targets"]).abs().mean()

    def score_sums(self, out, batch):
        torch = _torch()
        error = (out.float() - batch["targets"]).abs()
        n = count(len(error), error)
        # rel_l1: the L1 error over that of predicting zero (1.0 = no better than zero)
        return {
            "l1": torch.stack([error.mean(-1).sum(), n]),
            "rel_l1": torch.stack([error.sum(), batch["targets"].abs().sum()]),
        }


SEQUENCE_CLASSIFICATION = SequenceClassification()
VISUAL_QUESTION_ANSWERING = ImageQuestion()
IMAGE_CLASSIFICATION = ImageClassification()  # the triangles' images
IMAGE_SEQUENCE_CLASSIFICATION = ImageSequenceClassification()  # the ESBN tasks' objects
SEQUENCE_TO_SEQUENCE = SequenceToSequence()
AUTOREGRESSIVE_SEQ2SEQ = AutoregressiveSeq2Seq()
TRANSLATION = Translation()
NEXT_SYMBOL_SETS = NextSymbolSets()
SET_REGRESSION = SetRegression()

KINDS: dict[str, Kind] = {
    kind.name: kind
    for kind in (
        SEQUENCE_CLASSIFICATION,
        VISUAL_QUESTION_ANSWERING,
        IMAGE_CLASSIFICATION,
        IMAGE_SEQUENCE_CLASSIFICATION,
        SEQUENCE_TO_SEQUENCE,
        AUTOREGRESSIVE_SEQ2SEQ,
        TRANSLATION,
        NEXT_SYMBOL_SETS,
        SET_REGRESSION,
    )
}


def kind_named(name: str) -> Kind:
    return KINDS[name]
