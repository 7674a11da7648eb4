"""The per-(run, step, seed, layer) cells the findings are judged on."""

from __future__ import annotations

import pandas as pd

from attnsens.report.cells import COUNT_COLUMNS, layer_cells_of


def rows(n_eff: list[float], n_keys: list[int]) -> pd.DataFrame:
    k = len(n_eff)
    return pd.DataFrame({
        "run_id": ["r"] * k, "step": [0] * k, "seed": [0] * k, "layer": [0] * k, "n_keys": n_keys, "n_eff": n_eff,
        "theta_lower": [1.0] * k, "row_sum": [1.0] * k, "p_max": [0.1] * k, "normalized_entropy": [0.9] * k,
        "dominant": [False] * k, "argmax": [3] * k,
    })  # fmt: skip


def test_fractions_stay_fractions_and_counts_are_integers() -> None:
    """n_eff / n of near-uniform rows is a fraction near 1 (it was once cast to an integer count, printing 0)."""
    cells = layer_cells_of(rows([19.0, 30.0], [20, 40]))
    every = cells[cells["subset"] == "all"].iloc[0]
    assert abs(every["n_eff_fraction_mean"] - (19 / 20 + 30 / 40) / 2) < 1e-12
    assert abs(every["normalized_entropy_mean"] - 0.9) < 1e-12
    assert all(str(cells[c].dtype) == "int64" for c in COUNT_COLUMNS)
    assert every["n_rows"] == 2 and every["n_early"] == 0
