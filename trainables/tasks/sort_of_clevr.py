"""Sort-of-CLEVR (Santoro et al., 2017), as the Compositional Attention paper uses it (Mittal et al.,
Sec. 4.2, App. C.2), with the authors' generator (`Sort-of-CLEVR/sort_of_clevr_generator.py`) where
the paper is silent.

A scene: a white 75 x 75 image with six objects, one per colour (red, green, blue, orange, gray,
yellow), each a 11 x 11 square or a disk of radius 5 (a fair coin), centred at integers in [5, 70)
at least 10 pixels from the centres drawn before it; later objects are painted over earlier ones.
Per image, 10 questions of each type, encoded as the authors' 18 numbers (the paper's 11 cannot
name the ternary questions' second colour): one-hot colour A [0:6], colour B [6:12] (ternary
only), type [12:15] and subtype [15:18]. Ten answer classes: yes, no, rectangle, circle, counts 0..5.

  unary (1):   A's shape; is A on the left (x < 37.5)? is A on the top (y < 37.5)?
  binary (2):  the shape of the object closest to A; of the one furthest from A; how many other
               objects have A's shape?
  ternary (3): how many other objects lie in the closed axis-aligned box of A and B? is any other
               within 12 pixels vertically of the line through A and B? how many others make an
               obtuse (or right) triangle with A and B? A and B are two different colours among
               the first five (the authors' code never asks a ternary question about yellow).

`authors_closest` (default true) keeps the authors' "closest": their code replaces A's distance to
itself (0) by 999 (a squared distance, about 31.6 pixels), so A is its own closest object when all
others are farther, and the answer is A's shape; false asks the question as the paper words it.

Splits: 9,800 training images, 200 validation and 200 test (the authors' sizes), 30 questions each.
There is no out-of-distribution split: the validation images serve both validation slots, and the
question type is each sample's "depth" (1, 2, 3), so accuracy per depth is accuracy per question
type, the paper's three columns. The authors train on fresh batches of each type in turn; our
batches mix the types (the same questions, seen as often).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import numpy as np

from ..kinds import VISUAL_QUESTION_ANSWERING
from .base import Split, Task, cached, check_values

KIND = VISUAL_QUESTION_ANSWERING  # the probe's and the registry's (tasks.TASKS)

IMAGE_SIZE = 75
HALF_SIZE = 5  # a square's half side and a disk's radius
MIN_CENTRE_DISTANCE = 10
COLOURS = {
    "red": (255, 0, 0),
    "green": (0, 255, 0),
    "blue": (0, 0, 255),
    "orange": (255, 156, 0),
    "gray": (128, 128, 128),
    "yellow": (255, 255, 0),
}
SQUARE, DISK = 0, 1
QUESTION_SIZE = 18
TYPE_AT, SUBTYPE_AT = 12, 15
UNARY, BINARY, TERNARY = 1, 2, 3
YES, NO, RECTANGLE, CIRCLE, COUNT_ZERO = 0, 1, 2, 3, 4
CLASSES = ["yes", "no", "rectangle", "circle", *(str(k) for k in range(6))]
BAND = 12  # the authors' "grace threshold" of the is-on-band question
AUTHORS_SELF_DISTANCE = 999


@dataclass(frozen=True)
class SortOfClevrConfig:
    seed: int = 0
    train_images: int = 9800
    eval_images: int = 200  # validation and test, each
    questions_per_type: int = 10  # per image
    authors_closest: bool = True

    def __post_init__(self):
        check_values(self)


def draw_scenes(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """-> centres (n, 6, 2) as (x, y) in pixels and shapes (n, 6), one object per colour in COLOURS
    order, each centre redrawn until it keeps its distance from the earlier ones."""
    centres = np.zeros((n, len(COLOURS), 2), dtype=np.int16)
    for k in range(len(COLOURS)):
        todo = np.arange(n)
        while len(todo):
            centres[todo, k] = rng.integers(HALF_SIZE, IMAGE_SIZE - HALF_SIZE, size=(len(todo), 2))
            if k:
                gaps = ((centres[todo, :k] - centres[todo, k : k + 1]).astype(np.int32) ** 2).sum(-1)
                todo = todo[(gaps < MIN_CENTRE_DISTANCE**2).any(-1)]
            else:
                todo = todo[:0]
    shapes = (rng.random((n, len(COLOURS))) >= 0.5).astype(np.int8)  # the authors: random() < 0.5 is a square
    return centres, shapes


def render(centres: np.ndarray, shapes: np.ndarray) -> np.ndarray:
    """-> images (n, 75, 75, 3) uint8, row y, column x; objects painted in colour order."""
    n = len(centres)
    images = np.full((n, IMAGE_SIZE, IMAGE_SIZE, 3), 255, dtype=np.uint8)
    axis = np.arange(IMAGE_SIZE)
    for k, colour in enumerate(COLOURS.values()):
        dx = axis[None, None, :] - centres[:, k, 0, None, None]
        dy = axis[None, :, None] - centres[:, k, 1, None, None]
        square = (np.abs(dx) <= HALF_SIZE) & (np.abs(dy) <= HALF_SIZE)
        disk = dx**2 + dy**2 <= HALF_SIZE**2
        covered = np.where(shapes[:, k, None, None] == SQUARE, square, disk)
        images[covered] = colour
    return images


def answer(
    centres: np.ndarray,
    shapes: np.ndarray,
    kind: np.ndarray,
    subtype: np.ndarray,
    a: np.ndarray,
    b: np.ndarray,
    authors_closest: bool = True,
) -> np.ndarray:
    """The answer class of each question: one row per question, with its scene (centres (q, 6, 2),
    shapes (q, 6)), type, subtype and colours A and B (B only read by ternary questions)."""
    q = np.arange(len(kind))
    xy = centres.astype(np.int64)
    shape_class = np.where(shapes == SQUARE, RECTANGLE, CIRCLE)
    pa, pb = xy[q, a], xy[q, b]
    out = np.full(len(kind), -1, dtype=np.int64)

    def put(type_, sub, values):
        chosen = (kind == type_) & (subtype == sub)
        out[chosen] = values[chosen]

    put(UNARY, 0, shape_class[q, a])
    put(UNARY, 1, np.where(pa[:, 0] < IMAGE_SIZE / 2, YES, NO))
    put(UNARY, 2, np.where(pa[:, 1] < IMAGE_SIZE / 2, YES, NO))

    squared = ((xy - pa[:, None]) ** 2).sum(-1)  # (q, 6): each object's squared distance from A
    own = np.arange(len(COLOURS))[None] == a[:, None]
    self_distance = AUTHORS_SELF_DISTANCE if authors_closest else np.iinfo(np.int64).max
    put(BINARY, 0, shape_class[q, np.where(own, self_distance, squared).argmin(-1)])
    put(BINARY, 1, shape_class[q, squared.argmax(-1)])
    put(BINARY, 2, COUNT_ZERO + (shapes == shapes[q, a][:, None]).sum(-1) - 1)

    others = ~own & (np.arange(len(COLOURS))[None] != b[:, None])
    between, on_band, obtuse = ternary_relations(xy, pa, pb)
    put(TERNARY, 0, COUNT_ZERO + (between & others).sum(-1))
    put(TERNARY, 1, np.where((on_band & others).any(-1), YES, NO))
    put(TERNARY, 2, COUNT_ZERO + (obtuse & others).sum(-1))
    assert (out >= 0).all()
    return out


def ternary_relations(xy: np.ndarray, pa: np.ndarray, pb: np.ndarray) -> tuple[np.ndarray, ...]:
    """For each object C of each question's scene (q, 6), in integers: whether it lies in the box
    A and B span; whether it lies within BAND of the line through A and B, vertically:
    |(y - ya) dx - dy (x - xa)| <= BAND |dx| (a vertical line, dx = 0, only meets points straight
    above or below A); whether the triangle ABC has an angle of at least 90 degrees at some vertex
    and is not flat (its largest angle under 180)."""
    low, high = np.minimum(pa, pb)[:, None], np.maximum(pa, pb)[:, None]
    between = ((xy >= low) & (xy <= high)).all(-1)
    dx, dy = (pb - pa)[:, 0, None], (pb - pa)[:, 1, None]
    rel = xy - pa[:, None]
    on_band = np.where(
        dx != 0,
        np.abs(rel[..., 1] * dx - dy * rel[..., 0]) <= BAND * np.abs(dx),
        (rel[..., 0] == 0) & (np.abs(rel[..., 1]) <= BAND),
    )
    ca, cb = xy - pa[:, None], xy - pb[:, None]
    ab = (pb - pa)[:, None]
    at_a = (ca * ab).sum(-1) <= 0
    at_b = (cb * -ab).sum(-1) <= 0
    at_c = (ca * cb).sum(-1) <= 0
    flat = ca[..., 0] * ab[..., 1] - ca[..., 1] * ab[..., 0] == 0
    return between, on_band, (at_a | at_b | at_c) & ~flat


def encode(kind: np.ndarray, subtype: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    q = np.arange(len(kind))
    out = np.zeros((len(kind), QUESTION_SIZE), dtype=np.float32)
    out[q, a] = 1
    out[q[kind == TERNARY], 6 + b[kind == TERNARY]] = 1
    out[q, TYPE_AT + kind - 1] = 1
    out[q, SUBTYPE_AT + subtype] = 1
    return out


QUESTIONS = {
    UNARY: ("its shape?", "on the left?", "on the top?"),
    BINARY: ("the closest one's shape?", "the furthest one's shape?", "how many others have its shape?"),
    TERNARY: (
        "how many others in its box with {b}?",
        "any other on its line with {b}?",
        "how many others make an obtuse triangle with it and {b}?",
    ),
}


def describe(question: np.ndarray) -> str:
    """One encoded question in words, e.g. "red: how many others in its box with blue?"."""
    names = list(COLOURS)
    kind, subtype = int(question[TYPE_AT : TYPE_AT + 3].argmax()) + 1, int(question[SUBTYPE_AT:].argmax())
    text = QUESTIONS[kind][subtype].format(b=names[int(question[6:12].argmax())])
    return f"{names[int(question[:6].argmax())]}: {text}"


def make_split(config: SortOfClevrConfig, rng: np.random.Generator, n_images: int) -> Split:
    centres, shapes = draw_scenes(rng, n_images)
    per_image = 3 * config.questions_per_type
    image_ids = np.repeat(np.arange(n_images), per_image)
    kind = np.tile(np.repeat([UNARY, BINARY, TERNARY], config.questions_per_type), n_images)
    subtype = rng.integers(0, 3, size=len(kind))
    a = rng.integers(0, len(COLOURS), size=len(kind))
    # Ternary: two different colours among the first five (the authors' permutation of arange(5)).
    pairs = np.argsort(rng.random((len(kind), len(COLOURS) - 1)), axis=-1)[:, :2]
    a = np.where(kind == TERNARY, pairs[:, 0], a)
    b = np.where(kind == TERNARY, pairs[:, 1], -1)
    labels = answer(
        centres[image_ids], shapes[image_ids], kind, subtype, a, np.maximum(b, 0), config.authors_closest
    )
    return Split(
        {
            "images": render(centres, shapes),
            "centres": centres,
            "shapes": shapes,
            "image_ids": image_ids.astype(np.int32),
            "questions": encode(kind, subtype, a, b),
            "labels": labels.astype(np.int16),
            "depths": kind.astype(np.int16),
        }
    )


BLIND_SCENES = 2000


@functools.lru_cache(maxsize=2)
def blind_guess(authors_closest: bool) -> dict[str, float]:
    """What answering each question type and subtype with its likeliest answer scores, never looking
    at the image: per depth (type) and overall, the types asked equally often and the subtypes drawn
    uniformly. Ten classes make a uniform guess 0.100, but a ternary box holds no other object about
    two times in three, so a model blind to the scene scores about 0.50. Every question (each
    colour A, each ternary pair A, B) asked of BLIND_SCENES scenes of a seed of its own."""
    centres, shapes = draw_scenes(np.random.default_rng(2017), BLIND_SCENES)
    colours = np.arange(len(COLOURS))
    pairs = [(a, b) for a in colours[:-1] for b in colours[:-1] if a != b]
    per_depth = {}
    for kind in (UNARY, BINARY, TERNARY):
        asked = pairs if kind == TERNARY else [(a, 0) for a in colours]
        a, b = (np.tile(np.array([q[i] for q in asked]), BLIND_SCENES) for i in (0, 1))
        scene = np.repeat(np.arange(BLIND_SCENES), len(asked))
        likeliest = []
        for subtype in range(3):
            kinds, subtypes = np.full(len(a), kind), np.full(len(a), subtype)
            answers = answer(centres[scene], shapes[scene], kinds, subtypes, a, b, authors_closest)
            likeliest.append(np.bincount(answers).max() / len(answers))
        per_depth[f"depth{kind}_acc"] = float(np.mean(likeliest))
    return {"acc": float(np.mean(list(per_depth.values()))), **per_depth}


def probe(config: SortOfClevrConfig) -> Task:
    """The task without its data: what a model is built from (n_features: the question's width)."""
    return Task(
        name="sort_of_clevr",
        kind=KIND,
        splits={},
        classes=CLASSES,
        n_features=QUESTION_SIZE,
        blind_guess=functools.partial(blind_guess, config.authors_closest),
        describe=describe,
    )


def build(config: SortOfClevrConfig) -> Task:
    rng = np.random.default_rng(config.seed)
    validation = make_split(config, rng, config.eval_images)
    splits = {
        "train": make_split(config, rng, config.train_images),
        "iid_valid": validation,
        "ood_valid": validation,
        "test": make_split(config, rng, config.eval_images),
    }
    return dataclasses.replace(probe(config), splits=splits)


def load(config: SortOfClevrConfig) -> Task:
    return dataclasses.replace(
        cached("sort_of_clevr", config, functools.partial(build, config)), describe=describe
    )
