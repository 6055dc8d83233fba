"""DeepMind's mathematics problems (Saxton et al., 2019), the two modules PANM reports (Table 2
right, Table 13: `add_or_sub`, `place_value`), drawn by the dataset's own generator
(`mathematics-dataset` on PyPI, pinned) and read character by character, question in, answer out.

PANM follows Csordás et al. (2021), whose code (RobertCsordas/transformer_generalization,
`dataset/text/dm_math.py`, `tasks/dm_math_transformer.py`) trains on the released files'
train-easy, -medium and -hard (666,666 each per module, 10,000 of each held out as the IID test)
and reports accuracy on the extrapolation set. Ours are drawn the same way, by the generator
behind those files: `train` a third from each difficulty (the generator's entropy range cut in
three, as its `generate.py` does), `iid_valid` more of the same, `test_interpolate` the module's
interpolation generator and `test_extrapolate` its extrapolation one (`add_or_sub_big`,
`place_value_big`: larger numbers, longer questions), PANM's Table 2 number. The generator's own
filter drops questions over 160 characters and answers over 30. The IID hold-out fills both
validation slots (no selection: the final model is reported). Targets end with <eos>; a sample's
depth is its question's length.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import random
from dataclasses import dataclass, field

import numpy as np
from tqdm import tqdm

from ..kinds import AUTOREGRESSIVE_SEQ2SEQ
from .base import SPECIAL_TOKENS, Split, Task, cached, check_values, decoder_split

KIND = AUTOREGRESSIVE_SEQ2SEQ  # the probe's and the registry's (tasks.TASKS)

MODULES = {
    "add_or_sub": ("arithmetic", "add_or_sub", "add_or_sub_big"),
    "place_value": ("numbers", "place_value", "place_value_big"),
}
# Every character the two modules write (checked when a split is built).
CHARACTERS = " +-.0123456789?ACPSTWabcdefghiklmnoprstuwy"
VOCAB = SPECIAL_TOKENS + list(CHARACTERS)


@dataclass(frozen=True)
class MathematicsConfig:
    seed: int = 0
    module: str = field(default="add_or_sub", metadata={"choices": tuple(MODULES)})
    train_size: int = 1_999_998  # the release's three training files of 666,666
    eval_size: int = 10_000  # per validation and test set, as the release's

    def __post_init__(self):
        check_values(self)


@functools.cache
def generators() -> dict:
    """The dataset's training, interpolation and extrapolation generators. Its release imports
    `base_solution_linear` from `sympy.solvers.diophantine`, which sympy 1.6 moved into that
    package's `diophantine` module (torch needs sympy >= 1.13): the name is bound back first."""
    package = importlib.import_module("sympy.solvers.diophantine")
    if not hasattr(package, "base_solution_linear"):
        package.base_solution_linear = importlib.import_module(
            "sympy.solvers.diophantine.diophantine"
        ).base_solution_linear
    from mathematics_dataset import generate_settings  # noqa: PLC0415 - heavy (sympy); the generator only
    from mathematics_dataset.modules import modules  # noqa: PLC0415 - heavy (sympy); the generator only

    # generate.py's _make_entropy_fn(level, 3): a third of each module's entropy range
    def difficulty(level: int):
        return lambda low_high: (
            low_high[0] + level / 3 * (low_high[1] - low_high[0]),
            low_high[0] + (level + 1) / 3 * (low_high[1] - low_high[0]),
        )

    return {
        **{f"train_{level}": modules.train(difficulty(level)) for level in range(3)},
        "interpolate": modules.test(),
        "extrapolate": modules.test_extra(),
        "limits": (generate_settings.MAX_QUESTION_LENGTH, generate_settings.MAX_ANSWER_LENGTH),
    }


def draw(regime: str, module: str, count: int, rng: random.Random) -> list[tuple[str, str]]:
    """`count` (question, answer) pairs from the module's generators of a regime ("train": a third
    from each difficulty), with the generator's own length filter. The generator reads Python's
    and numpy's global random states: they are seeded from `rng` for the call and put back after it."""
    found = generators()
    group, own, extrapolated = MODULES[module]
    if regime == "train":
        makers = [found[f"train_{level}"][group][own] for level in range(3)]
    else:
        makers = [found[regime][group][extrapolated if regime == "extrapolate" else own]]
    longest_question, longest_answer = found["limits"]
    saved_python, saved_numpy = random.getstate(), np.random.get_state()
    random.seed(rng.getrandbits(64))
    np.random.seed(rng.getrandbits(32))
    out = []
    try:
        with tqdm(
            total=count,
            desc=f"mathematics {module} {regime}",
            unit=" problems",
            disable=count < 100_000,
            mininterval=10,
        ) as bar:
            for k, make in enumerate(makers):
                share = count // len(makers) + (1 if k < count % len(makers) else 0)
                while share:
                    problem = make()
                    question, answer = str(problem.question), str(problem.answer)
                    if len(question) <= longest_question and len(answer) <= longest_answer:
                        out.append((question, answer))
                        share -= 1
                        bar.update()
        return out
    finally:
        random.setstate(saved_python)
        np.random.set_state(saved_numpy)


def make_split(pairs: list[tuple[str, str]]) -> Split:
    unknown = {c for q, a in pairs for c in q + a} - set(CHARACTERS)
    if unknown:
        raise ValueError(
            f"the generator wrote characters outside the vocabulary: {''.join(sorted(unknown))!r}"
        )
    return decoder_split(pairs, VOCAB, [len(q) for q, _ in pairs])


def probe(config: MathematicsConfig) -> Task:
    return Task(name="mathematics", kind=KIND, splits={}, vocab=VOCAB, classes=list(CHARACTERS))


def build(config: MathematicsConfig) -> Task:
    rng = random.Random(config.seed)
    validation = make_split(draw("train", config.module, config.eval_size, rng))
    splits = {
        "train": make_split(draw("train", config.module, config.train_size, rng)),
        "iid_valid": validation,
        "ood_valid": validation,
        "test_interpolate": make_split(draw("interpolate", config.module, config.eval_size, rng)),
        "test_extrapolate": make_split(draw("extrapolate", config.module, config.eval_size, rng)),
    }
    return dataclasses.replace(probe(config), splits=splits)


def load(config: MathematicsConfig) -> Task:
    return cached("mathematics", config, functools.partial(build, config))
