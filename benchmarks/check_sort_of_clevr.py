"""Sort-of-CLEVR's generator checked as numbers: every question of a data set at the paper's size
(9,800 / 200 / 200 images, 30 questions each) answered again by the independent evaluator of
tests/test_sort_of_clevr.py, the question-type and subtype balance, each type's answer
distribution, and how often the authors' "closest" (A's own distance taken as 999) changes an answer.

    python benchmarks/check_sort_of_clevr.py [--seed 0]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from test_sort_of_clevr import evaluate  # noqa: E402 - the evaluator lives with the tests, apart from the generator

from trainables.tasks import sort_of_clevr as soc  # noqa: E402

TYPES = {1: "unary", 2: "binary", 3: "ternary"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    config = soc.SortOfClevrConfig(seed=args.seed)
    task = soc.build(config)
    paper = soc.build(soc.SortOfClevrConfig(seed=args.seed, authors_closest=False))
    splits = {
        "train": task.splits["train"],
        "validation": task.splits["iid_valid"],
        "test": task.splits["test"],
    }
    rows = []
    for name, split in splits.items():
        disagreements = 0
        for k in tqdm(range(len(split)), desc=f"evaluating {name}", mininterval=5):
            image = split.image_ids[k]
            disagreements += soc.CLASSES[split.labels[k]] != evaluate(
                split.centres[image], split.shapes[image], split.questions[k]
            )
        rows.append(
            {
                "split": name,
                "images": len(split.images),
                "questions": len(split),
                "disagreements": disagreements,
            }
        )
    print(pd.DataFrame(rows).to_string(index=False), "\n")

    train = splits["train"]
    subtypes = train.questions[:, soc.SUBTYPE_AT :].argmax(-1)
    frame = pd.DataFrame(
        {
            "type": [TYPES[d] for d in train.depths],
            "subtype": subtypes,
            "answer": [soc.CLASSES[a] for a in train.labels],
        }
    )
    print("training questions per type and subtype (fractions):")
    print(pd.crosstab(frame["type"], frame["subtype"], normalize="all").round(4).to_string(), "\n")
    print("answers per type (fractions of the type's questions):")
    print(
        pd.crosstab(frame["type"], frame["answer"], normalize="index")[soc.CLASSES].round(3).to_string(), "\n"
    )
    closest = (train.depths == soc.BINARY) & (subtypes == 0)
    changed = (train.labels[closest] != paper.splits["train"].labels[closest]).mean()
    print(
        f"closest-shape questions whose answer the authors' 999 changes: {changed:.1%} of {closest.sum():,}"
    )


if __name__ == "__main__":
    main()
