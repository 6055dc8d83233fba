"""What every sequence-classification task shares: splits as padded arrays, depth balancing, a disk cache."""

from __future__ import annotations

import ast
import concurrent.futures
import contextlib
import dataclasses
import fcntl
import functools
import hashlib
import inspect
import json
import multiprocessing
import os
import sys
import tempfile
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..kinds import Kind, kind_named

PAD, BOS, EOS = "<pad>", "<bos>", "<eos>"
SPECIAL_TOKENS = [PAD, BOS, EOS]

CACHE_ENV = "SYSGEN_DATA_CACHE"  # where generated tasks are kept (default ~/.cache/sysgen-data)


ZERO_ALLOWED = {"seed", "validation_combinations", "holdout"}


def check_values(config) -> None:
    """Values no generator can take, as ValueError naming the key, by the same rules for every task:
    sizes and counts positive, probabilities (p_*) in [0, 1), fractions (*_fraction) in (0, 1), depth
    ranges (lo, hi) with 1 <= lo <= hi, flags booleans, named choices (field metadata) respected;
    then the config's own `check()`."""
    for f in dataclasses.fields(config):
        key, value, hint = f.name, getattr(config, f.name), str(f.type)
        if value is None and "None" in hint:
            continue
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if "choices" in f.metadata:
            ok, want = value in f.metadata["choices"], f"one of {', '.join(f.metadata['choices'])}"
        elif hint == "bool":
            ok, want = isinstance(value, bool), "true or false"
        elif hint.startswith("tuple[int, int]"):
            ok = (
                isinstance(value, tuple)
                and len(value) == 2
                and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
                and 1 <= value[0] <= value[1]
            )
            want = "[low, high] with 1 <= low <= high"
        elif hint.startswith("tuple[int"):
            ok, want = (
                isinstance(value, tuple)
                and bool(value)
                and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value),
                "a list of positive integers",
            )
        elif hint.startswith("int"):
            ok = number and float(value).is_integer() and (value >= 0 if key in ZERO_ALLOWED else value > 0)
            want = "a non-negative integer" if key in ZERO_ALLOWED else "a positive integer"
        elif hint.startswith("float") and key.startswith("p_"):
            ok, want = number and 0 <= value < 1, "a probability in [0, 1)"
        elif hint.startswith("float") and key.endswith("_fraction"):
            ok, want = number and 0 < value < 1, "a fraction in (0, 1)"
        else:
            continue
        if not ok:
            raise ValueError(f"{key}: must be {want}, got {value!r}")
    if hasattr(config, "check"):
        config.check()


def user_folder(data_dir: str) -> Path:
    """The folder of a data set the user brings (this service cannot download it): `data_dir` with
    its $VARIABLES and ~ expanded."""
    return Path(os.path.expandvars(data_dir)).expanduser()


def check_user_folder(data_dir: str, holding: str) -> Path:
    """user_folder, or ValueError naming `data_dir` where a variable in it is unset or the folder missing."""
    folder, wanted = user_folder(data_dir), f"the folder holding {holding} (it cannot be downloaded here)"
    if "$" in str(folder):
        raise ValueError(f"data_dir: {data_dir!r} names an unset environment variable: set it to {wanted}")
    if not folder.is_dir():
        raise ValueError(f"data_dir: no folder {str(folder)!r}: give {wanted}")
    return folder


def hold_out(rows: list, fraction: float, rng: np.random.Generator) -> tuple[list, list]:
    """(the rest, a random `fraction` of `rows`), each in the rows' order: the IID validation set
    of a task whose sources have none (SCAN, bAbI, Multi30K), drawn from its training part."""
    held = set(rng.choice(len(rows), int(len(rows) * fraction), replace=False).tolist())
    return [r for k, r in enumerate(rows) if k not in held], [r for k, r in enumerate(rows) if k in held]


def at_most(rows: list, cap: int | None, rng: np.random.Generator) -> list:
    """`rows`, or a random `cap` of them in their order (an evaluation set's `eval_size`)."""
    if cap is None or len(rows) <= cap:
        return rows
    return [rows[k] for k in sorted(rng.choice(len(rows), cap, replace=False))]


def length_split(pairs: list, train_fraction: float) -> tuple[list, list]:
    """(the shortest `train_fraction` of (input, output) `pairs`, the rest, longer): the pairs sorted
    by their input's length, stably (ties keep their order), then cut: PANM's split of bAbI and
    Multi30K (App. D.4)."""
    ordered = sorted(pairs, key=lambda pair: len(pair[0]))
    cut = round(len(ordered) * train_fraction)
    return ordered[:cut], ordered[cut:]


@dataclass
class Split:
    """The arrays of one split, all with the same first dimension but those of a visual task's
    scenes (`images`, `centres`, `shapes`: one row per image, which its questions' `image_ids`
    index). Which arrays exist depends on the task kind (kinds.py); every kind has
    `depths`, the split-defining depth or length per sample (Sort-of-CLEVR: the question type)."""

    arrays: dict[str, np.ndarray]

    def __getattr__(self, name: str) -> np.ndarray:
        try:
            return self.__dict__["arrays"][name]
        except KeyError:
            raise AttributeError(name) from None

    def __len__(self) -> int:
        return len(self.arrays["depths"])

    def sequences(self) -> list[list[int]]:
        return [row[:n].tolist() for row, n in zip(self.tokens, self.lengths)]

    def target_sequences(self) -> list[list[int]]:
        return [row[:n].tolist() for row, n in zip(self.targets, self.target_lengths)]


HOST_ONLY = {"depths", "centres", "shapes"}  # what defines a split or a scene, never what a model reads


@dataclass
class Task:
    name: str
    kind: Kind
    splits: dict[str, Split]
    vocab: list[str] = field(default_factory=list)  # token tasks: inputs (and outputs, for seq2seq)
    classes: list[str] = field(default_factory=list)  # classification: the class names
    n_features: int = 0  # set tasks: features per set element; images without a question: channels
    # Tasks trained on fresh data every step (the PANM and Compositional Attention protocols):
    # (rng, batch size) -> one training batch as a Split. Not stored in the cache; loaders attach it.
    draw_train: Callable[[np.random.Generator, int], Split] | None = None
    # Question-answering tasks whose answers depend much on the question alone: () -> {score: what
    # the likeliest answer to each kind of question scores} (a model that ignores the image), their
    # chance. A call, not the numbers: counting them takes a second every probe would pay.
    blind_guess: Callable[[], dict[str, float]] | None = None
    # Tasks whose inputs no vocabulary decodes (Sort-of-CLEVR's encoded questions): one row's
    # question -> its words, a map's caption (kinds.Kind.legend). Not stored in the cache either.
    describe: Callable[[np.ndarray], str] | None = None

    @property
    def pad_id(self) -> int:
        return self.vocab.index(PAD)

    @property
    def bos_id(self) -> int:
        return self.vocab.index(BOS)

    @property
    def eos_id(self) -> int:
        return self.vocab.index(EOS)

    @property
    def n_classes(self) -> int:
        return len(self.classes)

    @property
    def metric(self) -> str:
        return self.kind.metric

    @property
    def scores(self) -> tuple[str, ...]:
        return self.kind.scores

    def chance(self, score: str | None = None) -> str:
        """What guessing scores on `score` (the task's first by default), in words ending in the
        number (a status line's and a plot's yardstick)."""
        score = score or self.metric
        guessed = self.blind_guess() if self.blind_guess else {}
        if score in guessed:
            return f"the likeliest answer to each question type: {guessed[score]:.3f}"
        return self.kind.chance(self, score)

    @property
    def test_splits(self) -> list[str]:
        return [s for s in self.splits if s.startswith("test")]

    @functools.cached_property
    def data_hash(self) -> str:
        """16 hex digits of what a run trains and is tested on: every split's arrays (name, dtype,
        shape, bytes), and for a task drawn afresh each step a batch drawn at a fixed seed, the
        generator's output that no stored split holds. Runs of one task config pool or compare only
        where these agree (docs/guide/tracking.md#data)."""
        digest = hashlib.sha256()
        splits = dict(self.splits)
        if self.draw_train is not None:
            splits["drawn_train"] = self.draw_train(np.random.default_rng(0), 16)
        for name in sorted(splits):
            for key, array in sorted(splits[name].arrays.items()):
                array = np.ascontiguousarray(array)
                digest.update(f"{name}.{key}:{array.dtype.str}:{array.shape}".encode())
                digest.update(array.tobytes())
        return digest.hexdigest()[:16]

    def decode(self, ids: Sequence[int]) -> list[str]:
        return [self.vocab[i] for i in ids]


def pad_rows(rows: Sequence[Sequence[int]], dtype=np.int16) -> np.ndarray:
    out = np.zeros((len(rows), max(len(r) for r in rows)), dtype=dtype)
    for k, r in enumerate(rows):
        out[k, : len(r)] = r
    return out


def pack_split(samples: Sequence[tuple[list[int], int, int]]) -> Split:
    """(token ids, label, depth) triples -> padded arrays."""
    return Split(
        {
            "tokens": pad_rows([s[0] for s in samples]),
            "lengths": np.array([len(s[0]) for s in samples], dtype=np.int16),
            "labels": np.array([s[1] for s in samples], dtype=np.int16),
            "depths": np.array([s[2] for s in samples], dtype=np.int16),
        }
    )


def decoder_split(
    pairs: Sequence[tuple[Sequence[str], Sequence[str]]], vocab: list[str], depths: Sequence[int]
) -> Split:
    """(input symbols, output symbols) pairs of a task whose decoder writes its output and <eos>."""
    ids = {s: k for k, s in enumerate(vocab)}
    return Split(
        {
            "tokens": pad_rows([[ids[s] for s in source] for source, _ in pairs]),
            "lengths": np.array([len(source) for source, _ in pairs], dtype=np.int16),
            "targets": pad_rows([[ids[s] for s in target] + [ids[EOS]] for _, target in pairs]),
            "target_lengths": np.array([len(target) + 1 for _, target in pairs], dtype=np.int16),
            "depths": np.asarray(depths, dtype=np.int16),
        }
    )


def held_out_splits(
    task: Task,
    split: Callable[[list], Split],
    rows: tuple[list, list, list],
    eval_size: int | None,
    rng: np.random.Generator,
) -> Task:
    """`task` with the splits of a source without validation data (SCAN, bAbI, Multi30K): `rows`
    are (training, IID hold-out, test) rows, each made a Split by `split`; the hold-out fills both
    validation slots, and each evaluation set keeps at most `eval_size` rows (the hold-out's drawn
    from `rng` first)."""
    train, held, test = rows
    validation = split(at_most(held, eval_size, rng))
    tested = split(at_most(test, eval_size, rng))
    return dataclasses.replace(
        task,
        splits={"train": split(train), "iid_valid": validation, "ood_valid": validation, "test": tested},
    )


def balanced_counts(total: int, depths: Sequence[int], capacity: Callable[[int], float]) -> dict[int, int]:
    """Split `total` over depths as evenly as the number of distinct samples per depth allows.

    Water-filling: a depth that cannot hold its share (CTL depth 1 has only 72 samples) gives the rest
    to the others, which is how the NDR paper's 53,704 CTL samples are "roughly balanced"."""
    counts = {d: 0 for d in depths}
    open_depths = list(depths)
    remaining = total
    while remaining > 0 and open_depths:
        share, extra = divmod(remaining, len(open_depths))
        # The remainder goes to the depths that have the fewest so far, so rounds do not stack it.
        for k, d in enumerate(sorted(open_depths, key=lambda d: counts[d])):
            take = int(min(share + (1 if k < extra else 0), capacity(d) - counts[d]))
            counts[d] += take
            remaining -= take
        open_depths = [d for d in open_depths if counts[d] < capacity(d)]
    if remaining > 0:
        raise ValueError(f"cannot draw {total} distinct samples from depths {list(depths)}")
    return counts


def draw_unique(
    count: int,
    draw: Callable[[], tuple[Hashable, list[int], int]],
    exclude: set,
    max_tries_per_sample: int = 200,
) -> list[tuple[Hashable, list[int], int]]:
    """Draw `count` samples whose keys are new (not in `exclude`, not repeated); adds the keys to
    `exclude`."""
    out = []
    tries = 0
    while len(out) < count:
        key, ids, label = draw()
        tries += 1
        if key in exclude:
            if tries > max_tries_per_sample * (count + 10):
                raise RuntimeError(f"generator saturated after {len(out)} of {count} unique samples")
            continue
        exclude.add(key)
        out.append((key, ids, label))
    return out


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV, Path.home() / ".cache" / "sysgen-data"))


@contextlib.contextmanager
def throwaway_data_cache() -> Iterator[None]:
    """Data generated inside go to a temporary folder, deleted on leaving (a calibration leaves
    nothing behind). Named in the environment, which the processes generating data in parallel read."""
    before = os.environ.get(CACHE_ENV)
    with tempfile.TemporaryDirectory() as folder:
        os.environ[CACHE_ENV] = folder
        try:
            yield
        finally:
            if before is None:
                del os.environ[CACHE_ENV]
            else:
                os.environ[CACHE_ENV] = before


@functools.cache
def generator_code(module: str) -> str:
    """16 hex digits of the code that makes a task's data: its module's and this one's syntax trees,
    so that a changed generator never reads what the old one cached (a comment or a reformat leaves
    the key as it was)."""
    trees = [ast.dump(ast.parse(inspect.getsource(sys.modules[name]))) for name in sorted({module, __name__})]
    return hashlib.sha256("\n".join(trees).encode()).hexdigest()[:16]


def cached(name: str, config, build: Callable[[], Task]) -> Task:
    """Load a generated task from disk, or build and store it.

    Keyed by the task's full config and the code of its generator (`build`'s module); written
    atomically, so a reader never sees a half-written file, even from another machine sharing the
    folder."""
    code = generator_code(getattr(build, "func", build).__module__)
    key_src = json.dumps({"name": name, "config": dataclasses.asdict(config), "code": code}, sort_keys=True)
    key = hashlib.sha256(key_src.encode()).hexdigest()[:16]
    path = cache_dir() / f"{name}-{key}.npz"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        # One process generates while the others on this machine wait for its file: ListOps'
        # million training samples take minutes, and every trial of a launch asks at once.
        with open(path.with_suffix(".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not path.exists():
                store(path, build())
    with np.load(path, allow_pickle=False) as f:
        meta = json.loads(str(f["meta"]))
        splits = {s: Split({k: f[f"{s}.{k}"] for k in names}) for s, names in meta.pop("splits").items()}
    splits.update({s: splits[same] for s, same in meta.pop("aliases", {}).items()})
    return Task(splits=splits, kind=kind_named(meta.pop("kind")), **meta)


def store(path: Path, task: Task) -> None:
    """A split that is another one (an IID hold-out filling both validation slots) is stored once,
    and loads as that one: trainers evaluate it once."""
    meta = {
        "kind": task.kind.name,
        **{k: getattr(task, k) for k in ("name", "vocab", "classes", "n_features")},
    }
    first = {}
    for s, split in task.splits.items():
        first.setdefault(id(split), s)
    meta["splits"] = {s: list(split.arrays) for s, split in task.splits.items() if first[id(split)] == s}
    meta["aliases"] = {s: first[id(split)] for s, split in task.splits.items() if first[id(split)] != s}
    arrays = {"meta": json.dumps(meta)}
    for s in meta["splits"]:
        for k, a in task.splits[s].arrays.items():
            arrays[f"{s}.{k}"] = a
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp.npz")
    os.close(fd)
    np.savez(tmp, **arrays)
    # mkstemp makes the file 0600; a cache shared by a team needs the mode a plain open() gives.
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    os.replace(tmp, path)


Drawer = Callable[[int], tuple[list[int], int]]  # depth -> (token ids, label)
CHUNK = 20_000
MAX_ROUNDS = 100


@dataclass(frozen=True)
class SplitPlan:
    name: str  # train, iid_valid, ood_valid or test
    depths: tuple[int, int]  # inclusive range
    size: int


def _draw_chunk(
    make_drawer: Callable[[np.random.Generator], Drawer], seed: list[int], depth: int, count: int
):
    draw_at = make_drawer(np.random.default_rng(seed))
    return [(*draw_at(depth), depth) for _ in range(count)]


def _draw_pieces(pieces: list[tuple]) -> list[list]:
    workers = min(len(pieces), os.cpu_count() or 1)
    if workers > 1 and sum(p[-1] for p in pieces) > 2 * CHUNK:
        ctx = multiprocessing.get_context("fork")
        with concurrent.futures.ProcessPoolExecutor(workers, mp_context=ctx) as pool:
            return list(pool.map(_draw_chunk, *zip(*pieces)))
    return [_draw_chunk(*piece) for piece in pieces]


def sample_balanced(
    counts: dict[int, int],
    make_drawer: Callable[[np.random.Generator], Drawer],
    seed: list[int],
    given: Sequence[tuple[list[int], int, int]] = (),
) -> Split:
    """`counts[d]` distinct samples at each depth d, plus the `given` ones, shuffled.

    Samples are unique within the split (as in the authors' generators). Work is cut into (depth,
    round, chunk) pieces, each with its own seed derived from `seed`, and duplicates are dropped in
    piece order, so the result is identical whether the pieces run in this process or in a pool
    (large splits, such as ListOps' 1M training samples, use every core). Each round draws what
    the previous rounds left short. `make_drawer` must be picklable."""
    seen = {tuple(ids) for ids, _, _ in given}
    kept: dict[int, list] = {d: [] for d in counts}
    for round_ in range(MAX_ROUNDS):
        short = {d: n - len(kept[d]) for d, n in counts.items() if len(kept[d]) < n}
        if not short:
            break
        pieces = [
            (make_drawer, [*seed, d, round_, c], d, min(CHUNK, n - start))
            for d, n in short.items()
            for c, start in enumerate(range(0, n, CHUNK))
        ]
        for chunk in _draw_pieces(pieces):
            for ids, label, depth in chunk:
                key = tuple(ids)
                if key not in seen and len(kept[depth]) < counts[depth]:
                    seen.add(key)
                    kept[depth].append((ids, label, depth))
    else:
        short = {d: n - len(kept[d]) for d, n in counts.items() if len(kept[d]) < n}
        if short:
            raise RuntimeError(
                f"generator saturated: depths {sorted(short)} lack {sum(short.values())} distinct samples"
            )
    samples = [*given, *(s for d in counts for s in kept[d])]
    order = np.random.default_rng([*seed, -1 % 2**32]).permutation(len(samples))
    return pack_split([samples[i] for i in order])


def even_counts(depths: Sequence[int], size: int) -> dict[int, int]:
    per_depth, extra = divmod(size, len(depths))
    return {d: per_depth + (1 if k < extra else 0) for k, d in enumerate(depths)}


def split_plans(config) -> list[SplitPlan]:
    """The four splits of a depth-generalization task. The IID validation set is drawn independently
    from the training distribution (shallow problems are few, so it may share some with train, as in
    the paper); OOD validation and test have their own, deeper depths. `config` has train_size,
    eval_size and the three depth ranges."""
    return [
        SplitPlan("train", tuple(config.train_depths), config.train_size),
        SplitPlan("iid_valid", tuple(config.train_depths), config.eval_size),
        SplitPlan("ood_valid", tuple(config.ood_valid_depths), config.eval_size),
        SplitPlan("test", tuple(config.test_depths), config.eval_size),
    ]


def depth_splits(
    config,
    make_drawer: Callable[[SplitPlan, np.random.Generator], Drawer],
    counts: Callable[[SplitPlan], dict[int, int]] | None = None,
    listed: Callable[[SplitPlan], list[tuple[list[int], int, int]]] | None = None,
) -> dict[str, Split]:
    """Each split drawn by `make_drawer(plan, rng)` (which may draw differently per split):
    `counts(plan)` samples per depth, evenly over the split's range by default, plus the samples
    `listed(plan)` gives whole (arithmetic's one-operation expressions)."""
    out = {}
    for k, plan in enumerate(split_plans(config)):
        per_depth = (
            counts(plan) if counts else even_counts(range(plan.depths[0], plan.depths[1] + 1), plan.size)
        )
        given = listed(plan) if listed else ()
        out[plan.name] = sample_balanced(
            per_depth, functools.partial(make_drawer, plan), [config.seed, k], given
        )
    return out
