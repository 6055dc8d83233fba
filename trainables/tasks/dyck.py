"""Dyck-n next-symbol prediction (Suzgun et al., 2019), as the PANM paper runs it (Sec. 3.2, App. D.2).

Strings of n bracket pairs from the probabilistic grammar
  S -> (_i S )_i  with probability p (the pair i uniform),  S -> S S  with probability q,
  S -> empty otherwise,
p = 0.5 and q = 0.25 (the defaults of the authors' code, suzgunmirac/marnns, which PANM adopts). After
each symbol the target is the set of symbols that may come next, as a multi-hot vector over the 2n
brackets: every opening bracket, and the closing bracket of the innermost open pair if there is one.
A string is right when every position's set is (each output thresholded at 0.5), the papers' accuracy.

Training strings (`train_size`, 5,000) are drawn as the authors' generator draws them: the grammar
expanded top-down with the running length capped at `max_train_length` L (a nested pair that cannot
fit, or a concatenation that grows too long, becomes empty), lengths 2..L kept. PANM trains on
L = 10 (Dyck-2) and 20 (Dyck-3). The authors' code keeps only distinct strings (marnns
`generate_list`: `if sample not in arr`), and so does this where the grammar has at least twice as
many as asked (Dyck-3 at L = 20: 1.1 billion; 1,926 distinct among 5,000 draws, 27% of them of
length 2, when draws repeated). That cannot give 5,000 for Dyck-2 at L = 10, which has 1,618 strings
of length 2..10 (the authors' loop would never end): there draws repeat. The validation set
is more draws of the training distribution (PANM selects the checkpoint on training data). The test
sets hold strings of exactly L + 2, 2L, 4L and 8L symbols (`test_<length>`), drawn from the grammar
conditioned on that length: the authors' capped generator hits an exact length 160 once in ~800 draws.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass

import numpy as np

from ..kinds import NEXT_SYMBOL_SETS
from .base import SPECIAL_TOKENS, Split, Task, cached, check_values, pad_rows

KIND = NEXT_SYMBOL_SETS  # the probe's and the registry's (tasks.TASKS)

BRACKETS = ["()", "[]", "{}", "<>", "+-", "ab", "xo"]  # the authors' pairs, in their order


@dataclass(frozen=True)
class DyckConfig:
    seed: int = 0
    n_pairs: int = 2  # Dyck-n; PANM runs 2 and 3
    p: float = 0.5  # S -> (_i S )_i
    q: float = 0.25  # S -> S S
    max_train_length: int = 10  # L; tests at L + 2, 2L, 4L, 8L
    train_size: int = 5000
    eval_size: int = 5000  # per validation and test set
    test_multipliers: tuple[int, ...] = (2, 4, 8)  # the tests beyond L + 2

    def __post_init__(self):
        check_values(self)

    def check(self) -> None:
        if not 1 <= self.n_pairs <= len(BRACKETS):
            raise ValueError(f"n_pairs: must be 1..{len(BRACKETS)}, got {self.n_pairs!r}")
        for key in ("p", "q"):
            value = getattr(self, key)
            if not (isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < 1):
                raise ValueError(f"{key}: must be a probability in (0, 1), got {value!r}")
        if self.p + self.q >= 1:
            raise ValueError(
                f"p, q: p + q must be below 1 (the rest is the empty string's), got {self.p + self.q}"
            )
        if self.max_train_length < 2 or self.max_train_length % 2:
            raise ValueError(
                "max_train_length: must be an even number of at least 2 (Dyck strings have even lengths), "
                f"got {self.max_train_length!r}"
            )

    @property
    def test_lengths(self) -> list[int]:
        return [self.max_train_length + 2] + [m * self.max_train_length for m in self.test_multipliers]


def symbols(n_pairs: int) -> list[str]:
    return [c for pair in BRACKETS[:n_pairs] for c in pair]


def draw_capped(rng: np.random.Generator, config: DyckConfig, length: int = 0) -> str:
    """The authors' generator: one expansion of S with the string's running length at `length`."""
    if length >= config.max_train_length:
        return ""
    r = rng.random()
    if r < config.p:
        pair = BRACKETS[int(rng.integers(config.n_pairs))]
        out = pair[0] + draw_capped(rng, config, length + 2) + pair[1]
    elif r < config.p + config.q:
        out = draw_capped(rng, config, length) + draw_capped(rng, config, length)
    else:
        return ""
    return out if len(out) <= config.max_train_length else ""


# The training set holds distinct strings where the grammar has this many times as many as asked
# (the authors' rule); nearer the whole of them, rejection would wait on ever rarer strings.
DISTINCT_ROOM = 2


def strings_up_to(n_pairs: int, longest: int) -> int:
    """How many strings of lengths 2..longest Dyck-n has: Catalan(k) shapes of k pairs, n^k bracket
    choices each."""
    return sum(math.comb(2 * k, k) // (k + 1) * n_pairs**k for k in range(1, longest // 2 + 1))


def inside(p: float, q: float, longest: int) -> np.ndarray:
    """I[n]: the probability that S derives some string of n symbols (odd n: 0). I[0] is the least
    root of I0 = (1 - p - q) + q I0^2; for n > 0, I[n] = p I[n-2] + q sum_k I[k] I[n-k], where
    the k = 0 and k = n terms hold I[n] itself and move to the left side."""
    out = np.zeros(longest + 1)
    out[0] = (1 - math.sqrt(1 - 4 * q * (1 - p - q))) / (2 * q)
    for n in range(2, longest + 1, 2):
        inner = sum(out[k] * out[n - k] for k in range(2, n - 1, 2))
        out[n] = (p * out[n - 2] + q * inner) / (1 - 2 * q * out[0])
    return out


def draw_of_length(rng: np.random.Generator, config: DyckConfig, n: int, weights: np.ndarray) -> str:
    """A derivation of the grammar conditioned on deriving exactly n symbols (weights: inside())."""
    if n == 0:
        return ""
    # The pair rule, then S S with the left part of length k = 0, 2, ..., n.
    splits = list(range(0, n + 1, 2))
    options = np.array([config.p * weights[n - 2]] + [config.q * weights[k] * weights[n - k] for k in splits])
    while True:
        choice = int(rng.choice(len(options), p=options / options.sum()))
        if choice == 0:
            pair = BRACKETS[int(rng.integers(config.n_pairs))]
            return pair[0] + draw_of_length(rng, config, n - 2, weights) + pair[1]
        k = splits[choice - 1]
        if 0 < k < n:
            return draw_of_length(rng, config, k, weights) + draw_of_length(rng, config, n - k, weights)
        # S S with one side empty: the other side is again S of n symbols.


def next_symbol_sets(string: str, n_pairs: int) -> np.ndarray:
    """(len, 2n) multi-hot: after each prefix, the symbols that may follow it."""
    alphabet = symbols(n_pairs)
    openers, closers = alphabet[0::2], alphabet[1::2]
    out = np.zeros((len(string), len(alphabet)), dtype=np.uint8)
    out[:, 0::2] = 1
    stack = []
    for t, c in enumerate(string):
        if c in openers:
            stack.append(closers[openers.index(c)])
        else:
            stack.pop()
        if stack:
            out[t, alphabet.index(stack[-1])] = 1
    return out


def make_split(strings: list[str], n_pairs: int) -> Split:
    ids = {c: len(SPECIAL_TOKENS) + k for k, c in enumerate(symbols(n_pairs))}
    longest = max(len(s) for s in strings)
    targets = np.zeros((len(strings), longest, 2 * n_pairs), dtype=np.uint8)
    for k, s in enumerate(strings):
        targets[k, : len(s)] = next_symbol_sets(s, n_pairs)
    lengths = np.array([len(s) for s in strings], dtype=np.int16)
    return Split(
        {
            "tokens": pad_rows([[ids[c] for c in s] for s in strings]),
            "lengths": lengths,
            "targets": targets,
            "target_lengths": lengths,
            "depths": lengths,
        }
    )


def probe(config: DyckConfig) -> Task:
    return Task(
        name="dyck",
        kind=KIND,
        splits={},
        vocab=SPECIAL_TOKENS + symbols(config.n_pairs),
        classes=symbols(config.n_pairs),
    )


def build(config: DyckConfig) -> Task:
    rng = np.random.default_rng(config.seed)

    def training_strings(count: int) -> list[str]:
        distinct = strings_up_to(config.n_pairs, config.max_train_length) >= DISTINCT_ROOM * count
        out, seen = [], set()
        while len(out) < count:
            s = draw_capped(rng, config)
            if len(s) >= 2 and not (distinct and s in seen):
                out.append(s)
                seen.add(s)
        return out

    weights = inside(config.p, config.q, max(config.test_lengths))
    splits = {"train": make_split(training_strings(config.train_size), config.n_pairs)}
    splits["iid_valid"] = splits["ood_valid"] = make_split(training_strings(config.eval_size), config.n_pairs)
    for n in config.test_lengths:
        splits[f"test_{n}"] = make_split(
            [draw_of_length(rng, config, n, weights) for _ in range(config.eval_size)], config.n_pairs
        )
    return dataclasses.replace(probe(config), splits=splits)


def load(config: DyckConfig) -> Task:
    return cached("dyck", config, functools.partial(build, config))
