"""Sort-of-CLEVR's generator against an evaluator written from the paper (Mittal et al., App. C.2)
and the authors' generator (`sort_of_clevr_generator.py`): question by question in plain Python,
over the scene description, with the authors' geometry (list distances, the four-clause box, the
line y = m x + c, angles from the law of cosines); and the images against the scenes."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch

from trainables.tasks import sort_of_clevr as soc

CLASS = {name: k for k, name in enumerate(soc.CLASSES)}


def decode(question: np.ndarray) -> tuple[int, int, int, int | None]:
    """-> (type 1..3, subtype 0..2, colour A, colour B or None), from the 18 numbers."""
    assert set(question.tolist()) <= {0.0, 1.0} and question.sum() == (4 if question[14] else 3)
    kind = int(np.argmax(question[12:15])) + 1
    b = int(np.argmax(question[6:12])) if kind == 3 else None
    return kind, int(np.argmax(question[15:18])), int(np.argmax(question[0:6])), b


def evaluate(
    centres: np.ndarray, shapes: np.ndarray, question: np.ndarray, authors_closest: bool = True
) -> str:
    kind, subtype, a, b = decode(question)
    objects = [
        (tuple(int(v) for v in c), "rectangle" if s == soc.SQUARE else "circle")
        for c, s in zip(centres, shapes)
    ]
    (ax, ay), shape_a = objects[a]
    if kind == 1:
        if subtype == 0:
            return shape_a
        return "yes" if (ax if subtype == 1 else ay) < 75 / 2 else "no"
    if kind == 2:
        distances = [(ax - x) ** 2 + (ay - y) ** 2 for (x, y), _ in objects]
        if subtype == 0:
            distances[a] = 999 if authors_closest else math.inf
            return objects[distances.index(min(distances))][1]
        if subtype == 1:
            return objects[distances.index(max(distances))][1]
        return str(sum(shape == shape_a for _, shape in objects) - 1)
    (bx, by), _ = objects[b]
    others = [xy for k, (xy, _) in enumerate(objects) if k not in (a, b)]
    if subtype == 0:
        inside = [
            (ax <= x <= bx and ay <= y <= by)
            or (ax <= x <= bx and by <= y <= ay)
            or (bx <= x <= ax and by <= y <= ay)
            or (bx <= x <= ax and ay <= y <= by)
            for x, y in others
        ]
        return str(sum(inside))
    if subtype == 1:
        if ax == bx:  # the authors' epsilon makes the slope of a vertical line huge: only x = ax is near it
            near = [x == ax and abs(y - ay) <= 12 for x, y in others]
        else:
            m = Fraction(by - ay, bx - ax)
            near = [abs(y - (m * x + (ay - m * ax))) <= 12 for x, y in others]
        return "yes" if any(near) else "no"
    # The authors' law of cosines in floats: its error near 90 and 180 degrees is about 1e-6 degrees, while
    # integer points 75 pixels apart are never within 0.005 degrees of either without being on it.
    tolerance = 1e-4
    count = 0
    for cx, cy in others:
        la, lb, lc = (
            math.dist((bx, by), (cx, cy)),
            math.dist((cx, cy), (ax, ay)),
            math.dist((ax, ay), (bx, by)),
        )
        angles = [
            math.degrees(math.acos(max(-1.0, min(1.0, (p * p + q * q - r * r) / (2 * p * q)))))
            for p, q, r in ((lb, lc, la), (la, lc, lb), (la, lb, lc))
        ]
        count += 90 - tolerance <= max(angles) < 180 - tolerance
    return str(count)


@pytest.fixture(scope="module")
def split():
    return soc.make_split(soc.SortOfClevrConfig(), np.random.default_rng(11), 400)


def test_every_answer_agrees_with_the_evaluator(split):
    questions = split.questions
    for k in range(len(split)):
        image = split.image_ids[k]
        assert soc.CLASSES[split.labels[k]] == evaluate(
            split.centres[image], split.shapes[image], questions[k]
        ), k
        assert decode(questions[k])[0] == split.depths[k]


def test_the_papers_closest_never_answers_with_the_object_itself():
    config = soc.SortOfClevrConfig(authors_closest=False)
    split = soc.make_split(config, np.random.default_rng(5), 200)
    for k in np.flatnonzero(split.depths == 2):
        image = split.image_ids[k]
        assert soc.CLASSES[split.labels[k]] == evaluate(
            split.centres[image], split.shapes[image], split.questions[k], authors_closest=False
        )
    authors = soc.make_split(soc.SortOfClevrConfig(), np.random.default_rng(5), 200)
    closest = (split.depths == 2) & (split.questions[:, 15] == 1)
    assert (authors.labels[closest] != split.labels[closest]).any()  # the authors' 999 differs sometimes


def test_scenes_keep_their_distances_and_questions_their_mix(split):
    gaps = ((split.centres[:, :, None].astype(int) - split.centres[:, None].astype(int)) ** 2).sum(-1)
    off_diagonal = ~np.eye(6, dtype=bool)
    assert (gaps[:, off_diagonal] >= 100).all()
    assert split.centres.min() >= 5 and split.centres.max() <= 69
    per_image = np.bincount(split.image_ids)
    assert (per_image == 30).all()
    for kind in (1, 2, 3):
        assert (np.bincount(split.image_ids[split.depths == kind]) == 10).all()
    decoded = [decode(q) for q in split.questions]
    ternary = [(a, b) for kind, _, a, b in decoded if kind == 3]
    assert all(a != b and a < 5 and b < 5 for a, b in ternary)  # the authors' colours for ternary questions
    assert {a for kind, _, a, _ in decoded if kind != 3} == set(range(6))
    assert {s for _, s, _, _ in decoded} == {0, 1, 2}


def test_chance_is_the_likeliest_answer_to_each_question_type():
    """A model that reads the question and not the image: the answer it learned likeliest for each
    question's type and subtype on one split, scored on another. Ten classes made chance "uniform
    guess: 0.100", a fifth of what such a model scores (about 0.50; 0.53 on ternary questions)."""
    from orchestrator.report.plots import chance_level

    def asked(split) -> list[tuple[int, int]]:  # each question's type and subtype
        return [decode(q)[:2] for q in split.questions]

    learn, held_out = (
        soc.make_split(soc.SortOfClevrConfig(), np.random.default_rng(seed), 1500) for seed in (1, 2)
    )
    seen: dict[tuple[int, int], list[int]] = {}
    for question, label in zip(asked(learn), learn.labels.tolist()):
        seen.setdefault(question, []).append(label)
    likeliest = {question: max(set(labels), key=labels.count) for question, labels in seen.items()}
    right = np.array([likeliest[q] == label for q, label in zip(asked(held_out), held_out.labels.tolist())])
    task = soc.probe(soc.SortOfClevrConfig())
    assert task.chance().startswith("the likeliest answer to each question type: ")
    assert abs(chance_level(task.chance()) - right.mean()) < 0.01 and chance_level(task.chance()) > 0.45
    for kind in (1, 2, 3):
        assert (
            abs(chance_level(task.chance(f"depth{kind}_acc")) - right[held_out.depths == kind].mean()) < 0.02
        ), kind


def test_images_show_the_scenes(split):
    """Each object that no later one overlaps shows its whole shape in its colour: 121 pixels for a
    11 x 11 square, 81 for a disk of radius 5; the rest of the image is white."""
    colours = np.array(list(soc.COLOURS.values()))
    for image, centres, shapes in zip(split.images, split.centres, split.shapes):
        painted = np.zeros((75, 75), dtype=bool)
        for k, ((x, y), shape) in enumerate(zip(centres.astype(int), shapes)):
            mine = (image == colours[k]).all(-1)
            painted |= mine
            later = centres[k + 1 :].astype(int)
            overlapped = len(later) and (np.abs(later - (x, y)).max(-1) <= 10).any()
            if not overlapped:
                assert mine.sum() == (121 if shape == soc.SQUARE else 81)
                assert mine[y, x] and mine[y - 5, x] and mine[y, x + 5]
                assert mine[y - 5, x - 5] == (shape == soc.SQUARE)  # a square's corner, outside the disk
        assert (image[~painted] == 255).all()


def test_question_types_are_scored_separately_by_the_trainer():
    """Depth is the question type: evaluate(by_depth) gives the paper's three columns."""
    from trainables.batches import batch_tensors
    from trainables.evaluation import evaluate as evaluate_split
    from trainables.models import build_model

    config = soc.SortOfClevrConfig(train_images=2, eval_images=4)
    task = soc.build(config)
    batch = batch_tensors(task.splits["test"], np.arange(7), torch.device("cpu"))
    assert batch["images"].shape == (7, 75, 75, 3) and batch["images"].dtype == torch.uint8
    assert torch.equal(
        batch["images"][6], torch.from_numpy(task.splits["test"].images[0])
    )  # question 6 is about image 0
    model = build_model(
        "transformer_compositional", {"d_model": 16, "n_heads": 2, "n_layers": 1, "retrieval_dim": 4}, task
    )
    scores = evaluate_split(model, task, task.splits["test"], 32, torch.device("cpu"), by_depth=True)
    assert set(scores) == {"acc", "depth1_acc", "depth2_acc", "depth3_acc"}


def test_each_question_type_is_reported_at_its_own_best_validation_epoch(monkeypatch):
    """The authors keep, per question type, the test accuracy at that type's best validation epoch
    (strictly better: a tie keeps the earlier one); the pooled accuracy keeps one checkpoint."""
    from trainables.config import parse_trial_config
    from trainables.evaluation import Selection

    config = soc.SortOfClevrConfig(train_images=2, eval_images=4)
    task = soc.build(config)
    cfg = parse_trial_config(
        {"task": "sort_of_clevr", "model": "transformer_compositional", "n_iters": 3, "eval_every": 1}
    )
    # Per evaluation: validation's, then test's, accuracies per type (and pooled).
    valid = [(0.9, 0.3, 0.3), (0.5, 0.8, 0.3), (0.9, 0.7, 0.4)]
    test = [(0.91, 0.31, 0.32), (0.51, 0.81, 0.33), (0.92, 0.71, 0.41)]
    scripted = iter([s for v, t in zip(valid, test) for s in (v, t)])

    def scores(self, model, name, by_depth=False):
        accs = next(scripted)
        return {"acc": sum(accs) / 3, **{f"depth{d}_acc": a for d, a in zip((1, 2, 3), accs)}}

    monkeypatch.setattr(Selection, "evaluate_split", scores)
    selection = Selection(cfg, task, torch.device("cpu"), None, "soc")
    for iteration in (1, 2, 3):
        metrics = selection(None, iteration, 0.1, {"acc": 0.5}, 1.0)
    assert [metrics[f"test_depth{d}_acc_at_best"] for d in (1, 2, 3)] == [0.91, 0.81, 0.41]
    assert [metrics[f"best_iteration_depth{d}_acc"] for d in (1, 2, 3)] == [1, 2, 3]
    assert metrics["best_iteration"] == 3 and metrics["test_acc_at_best"] == pytest.approx(
        (0.92 + 0.71 + 0.41) / 3
    )
    restored = Selection(cfg, task, torch.device("cpu"), None, "soc")
    restored.restore(selection.state())
    assert restored.depth_best == selection.depth_best


def test_the_reports_attention_map_reads_a_question_about_an_image(tmp_path):
    from orchestrator.report.maps import activations_of, plot_transformer
    from trainables.config import parse_trial_config
    from trainables.steps import make_model
    from trainables.tasks import load_task

    config = {
        "task": "sort_of_clevr",
        "model": "transformer",
        "task_options": {"train_images": 2, "eval_images": 2},
        "d_model": 16,
        "n_heads": 2,
        "n_layers": 2,
    }
    cfg = parse_trial_config(config)
    state = make_model(cfg, load_task(cfg.task, cfg.task_options)).state_dict()
    task, names, caption, activations = activations_of(config, state)
    assert (
        names[:2] == ["summary", "r1c1"] and len(names) == 26 and activations["attention"][0].shape[-1] == 26
    )
    assert caption.startswith(tuple(soc.COLOURS)) and " with " in caption  # a ternary question, in words
    path, _ = plot_transformer("sort_of_clevr__transformer", names, caption, activations, tmp_path)
    assert path.stat().st_size > 0


@pytest.mark.parametrize("n_question, channels, patch", [(5, 3, 15), (0, 1, 4)])
@torch.no_grad()
def test_the_image_model_against_its_equations(n_question, channels, patch):
    """Sec. 4.2 / App. C.2-C.3 and the authors' Sort-of-CLEVR and triangles models, token by token:
    each patch embedded by one weight per (pixel, channel) (the convolution), plus its position's
    sinusoids; a learnt summary token first; the question's embedding beside every token and one map
    mixing the two (Sort-of-CLEVR); then the pre-norm layer n_layers times, x + Attn(LN x) and
    x + FF(LN x), multi-head softmax attention by hand; the summary token's column classified."""
    from test_scan import slow_attention

    from trainables.models.configs import TransformerConfig
    from trainables.models.transformer import ImageQuestionTransformer, sinusoids

    torch.manual_seed(0)
    d, heads, side = 8, 2, 2 * patch
    cfg = TransformerConfig(d_model=d, n_heads=heads, n_layers=2, dropout=0.0, query_dropout=0.0)
    net = (
        ImageQuestionTransformer(cfg, "softmax", n_question, 3, patch=patch, channels=channels)
        .double()
        .eval()
    )
    images = torch.randint(0, 256, (2, side, side, channels), dtype=torch.uint8)
    questions = torch.randn(2, n_question, dtype=torch.float64)
    width = d // 2 if n_question else d
    conv, layer = net.patches, net.layer

    def layer_norm(module, x):
        return (x - x.mean()) / torch.sqrt(x.var(unbiased=False) + module.eps) * module.weight + module.bias

    for b in range(2):
        pixels = images[b].double() / 255
        tokens = [net.summary[0, 0]]
        for k, (row, col) in enumerate((r, c) for r in range(2) for c in range(2)):
            window = pixels[
                row * patch : (row + 1) * patch, col * patch : (col + 1) * patch
            ]  # (patch, patch, channels)
            embedded = torch.stack(
                [(conv.weight[o].permute(1, 2, 0) * window).sum() + conv.bias[o] for o in range(width)]
            )
            tokens.append(embedded + sinusoids(torch.tensor([k]), width)[0])
        if n_question:
            question = net.question.weight @ questions[b] + net.question.bias
            tokens = [net.mix.weight @ torch.cat([x, question]) + net.mix.bias for x in tokens]
        for _ in range(cfg.n_layers):
            normed = [layer_norm(layer.norm_attention, x) for x in tokens]
            tokens = [x + a for x, a in zip(tokens, slow_attention(layer.attention, normed, normed, heads))]
            tokens = [
                x
                + layer.ff[3].weight
                @ torch.relu(layer.ff[0].weight @ layer_norm(layer.norm_ff, x) + layer.ff[0].bias)
                + layer.ff[3].bias
                for x in tokens
            ]
        expected = net.readout.weight @ tokens[0] + net.readout.bias
        torch.testing.assert_close(
            net(images[b : b + 1], questions[b : b + 1] if n_question else None)[0], expected
        )
