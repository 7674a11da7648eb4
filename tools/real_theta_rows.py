"""Regenerate ``tests/data/tiny_gpt_early_rows.npz``: real attention rows of 25–63 keys for the θ tests.

The rows come from the tiny Pre-LN GPT of ``attnsens train --config tiny`` at checkpoints 0–64 (the early-training
regime where attention is near-uniform), every layer, head and query of four held-out blocks, as
``bench/theta.py`` captures them (training on CPU is seeded, so the rows reproduce). Kept: 6 random rows of each
support size 25–63, and the rows listed in ``HARD_ROWS``, which the cascade before the four-list and three-group
stages left wider than 2^-25.

    .venv/bin/python tools/real_theta_rows.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "data" / "tiny_gpt_early_rows.npz"
SUPPORTS = range(25, 64)
PER_SUPPORT = 6
HARD_ROWS = (39075, 39077, 39331, 39333, 40099, 40480, 40611, 40613, 40618, 40638, 40867, 40869)
WIDTH = 64


def main() -> None:
    sys.path.insert(0, str(ROOT / "bench"))
    from theta import tiny_gpt_rows

    rows = tiny_gpt_rows(4).numpy()
    support = (rows > 0).sum(1)
    rng = np.random.default_rng(0)
    picked = [int(i) for n in SUPPORTS for i in rng.permutation(np.flatnonzero(support == n))[:PER_SUPPORT]]
    picked += [i for i in HARD_ROWS if i not in picked]
    values = np.zeros((len(picked), WIDTH), np.float32)
    for k, i in enumerate(picked):
        row = rows[i][rows[i] > 0]
        values[k, : row.size] = row
    np.savez_compressed(OUT, rows=values, source_index=np.array(picked), hard=np.isin(picked, HARD_ROWS))
    print(f"{OUT.relative_to(ROOT)}: {len(picked)} rows of {SUPPORTS.start}–{SUPPORTS.stop - 1} keys")


if __name__ == "__main__":
    main()
