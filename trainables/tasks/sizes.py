"""What an evaluation scores, known without generating the data: each evaluation set's rows and
their mean length, beside a training sample's, as a dry run and `orchestrator train` price
evaluations (orchestrator/run/cost_model.py). One function per task (TaskSpec.eval_sizes), from
its config and its module's own rules; tests/test_cost_model.py holds each to the sets its task
builds. Here rather than in each task's module: a generator module's code keys its data cache, and
pricing is no reason to generate data again. A task read from the user's files (bAbI, Multi30K) or
whose lengths only its generator knows (mathematics) has None."""

from __future__ import annotations

from dataclasses import dataclass

from . import algorithmic, dyck, esbn, scan


@dataclass(frozen=True)
class EvalSet:
    """One evaluation set. `length`: a row's mean positions (input and output) in the unit its
    task counts a training sample's in; `outputs`: a row's mean output positions, what a kind that
    decodes greedily calls its model for one at a time (kinds.Kind.decodes)."""

    name: str
    rows: int
    length: float
    outputs: float = 1.0


@dataclass(frozen=True)
class EvalSizes:
    """A task's evaluation sets: `validation`, scored at every evaluation (a set that fills both
    validation slots once), and `tests`, scored where a checkpoint is kept (evaluation.Selection)."""

    train_length: float  # a training sample's mean positions
    validation: tuple[EvalSet, ...]
    tests: tuple[EvalSet, ...]
    # The task's kind decodes greedily (kinds.Kind.decodes): a row costs a call per output position.
    decodes: bool = False


def unknown(config) -> None:
    return None


def depth_sizes(config, length=lambda depth: depth) -> EvalSizes:
    """The three sets of a depth-generalization task (CTL, arithmetic, ListOps: `eval_size` problems
    each over a depth range), a problem of depth d `length(d)` long, taken at its range's middle."""

    def at(depths: tuple[int, int]) -> float:
        return length((depths[0] + depths[1]) / 2)

    return EvalSizes(
        at(config.train_depths),
        (
            EvalSet("iid_valid", config.eval_size, at(config.train_depths)),
            EvalSet("ood_valid", config.eval_size, at(config.ood_valid_depths)),
        ),
        (EvalSet("test", config.eval_size, at(config.test_depths)),),
    )


def ctl(config) -> EvalSizes:
    """A problem of depth d is a symbol and d functions."""
    return depth_sizes(config, lambda depth: depth + 1)


def expressions(config) -> EvalSizes:
    """Arithmetic's and ListOps' expressions, their length taken as proportional to their depth."""
    return depth_sizes(config)


def algorithmic_sizes(name: str, config) -> EvalSizes:
    """PANM's tasks: a row's input and output, each about its length long; training lengths uniform
    in shortest..L."""
    L = algorithmic.train_length(name, config)
    trained = algorithmic.shortest(name) + L

    def fixed(split: str, length: int) -> EvalSet:
        return EvalSet(split, config.eval_size, 2 * length)

    tests = [algorithmic.test_length(name, L, k) for k in config.test_multipliers]
    return EvalSizes(
        trained,
        (
            EvalSet("iid_valid", config.eval_size, trained),
            fixed("ood_valid", config.ood_valid_length or L + 1),
        ),
        (fixed("test_L", L), *(fixed(f"test_x{k}", n) for k, n in zip(config.test_multipliers, tests))),
    )


def dyck_length(config, count: int) -> float:
    """A drawn training string's mean length, about: the capped grammar draws short strings most
    (5.1 symbols of Dyck-2 at L = 10 over 5,000 draws); kept distinct, as where the grammar has room
    (dyck.build), the short ones run out (8.6 of 300 at L = 10, 13.8 of 5,000 of Dyck-3 at L = 20)."""
    distinct = dyck.strings_up_to(config.n_pairs, config.max_train_length) >= dyck.DISTINCT_ROOM * count
    return config.max_train_length * (0.75 if distinct else 0.5)


def dyck_sizes(config) -> EvalSizes:
    """One validation set of training strings in both slots, and a test set per length."""
    return EvalSizes(
        dyck_length(config, config.train_size),
        (EvalSet("iid_valid", config.eval_size, dyck_length(config, config.eval_size)),),
        tuple(EvalSet(f"test_{n}", config.eval_size, n) for n in config.test_lengths),
    )


def same_size(validation: tuple[str, ...], tests: tuple[str, ...], rows: int) -> EvalSizes:
    """Sets of `rows` samples each, of the training samples' size (images, sets of vectors)."""
    return EvalSizes(
        1, tuple(EvalSet(n, rows, 1) for n in validation), tuple(EvalSet(n, rows, 1) for n in tests)
    )


def retrieval(config) -> EvalSizes:
    return same_size(("iid_valid", "ood_valid"), ("test",), config.eval_size)


def triangles(config) -> EvalSizes:
    """One validation set in both slots."""
    return same_size(("iid_valid",), ("test",), config.eval_size)


def sort_of_clevr(config) -> EvalSizes:
    """One validation set in both slots; every image's questions of each of 3 types."""
    return same_size(("iid_valid",), ("test",), config.eval_images * 3 * config.questions_per_type)


def esbn_sizes(config) -> EvalSizes:
    """The IID set is the training set's first `eval_size` trials; the test set as esbn.set_sizes."""
    train_size, test_size = esbn.set_sizes(config)
    return EvalSizes(
        1,
        (
            EvalSet("iid_valid", min(config.eval_size, train_size), 1),
            EvalSet("ood_valid", config.eval_size, 1),
        ),
        (EvalSet("test", test_size, 1),),
    )


def scan_sizes(config) -> EvalSizes:
    """Counted off the grammar: the IID hold-out in both validation slots, the longer commands the
    test set; a row's length its command's words and its actions with <eos>, its outputs the
    actions with <eos>."""
    everything = scan.commands()
    short = [p for p in everything if len(p[1]) <= config.length_cutoff]
    long = [p for p in everything if len(p[1]) > config.length_cutoff]

    def of(name: str, pairs: list, rows: int) -> EvalSet:
        words, actions = (sum(len(p[k]) for p in pairs) / max(len(pairs), 1) for k in (0, 1))
        capped = rows if config.eval_size is None else min(rows, config.eval_size)
        return EvalSet(name, capped, words + actions + 1, actions + 1)

    held = of("iid_valid", short, int(len(short) * config.iid_fraction))
    return EvalSizes(held.length, (held,), (of("test", long, len(long)),))
