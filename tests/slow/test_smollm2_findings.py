"""The θ finding on the shipped SmolLM2 against the test's own envelope: "implied by p_max" exactly where the median
of E = max(s − m², 4m(s − m) + s(1 − s)) over a layer's core rows reaches the threshold in every layer.

The audit runs through the CLI on the built-in corpus (Shakespeare), so findings.json is what a user gets.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from attnsens.cli import app
from attnsens.store import read_table

pytestmark = pytest.mark.slow

EARLY_KEYS = 16  # core rows: not a sink (argmax at key 0) and at least this many keys
MARGIN = 0.02  # medians this close to a threshold may fall either side of the bootstrap interval


@pytest.fixture(scope="module")
def audited(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("audit") / "smollm2"
    result = CliRunner().invoke(app, ["audit", "smollm2", "--seq-len", "128", "--batch", "8", "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out


def _envelope_medians(rows) -> dict[int, float]:
    core = rows[(rows["argmax"] != 0) & (rows["n_keys"] >= EARLY_KEYS)]
    m, s = core["p_max"].to_numpy(float), core["row_sum"].to_numpy(float)
    envelope = np.maximum(s - m**2, 4 * m * (s - m) + s * (1 - s))
    return core.assign(envelope=envelope).groupby("layer")["envelope"].median().to_dict()


@pytest.mark.parametrize("threshold", [0.9, 0.99])
def test_core_theta_is_implied_by_p_max_exactly_where_the_envelope_reaches_the_threshold(audited, threshold) -> None:
    medians = _envelope_medians(read_table(audited / "rows"))
    assert len(medians) == 30
    findings = json.loads((audited / "findings.json").read_text(encoding="utf-8"))
    (theta,) = [
        f for f in findings if f["finding"] == "theta" and f["subset"] == "core" and f["threshold"] == threshold
    ]

    # the finding counts the layers whose envelope median reaches the threshold as this test does
    assert theta["cells_envelope_reaches"] == sum(v >= threshold for v in medians.values())
    lowest = min(medians.values())
    assert theta["envelope_statistic"] == pytest.approx(lowest, abs=1e-6)
    if lowest >= threshold + MARGIN:
        assert theta["verdict"] == "implied by p_max"
    elif lowest < threshold:
        assert theta["verdict"] != "implied by p_max"
        # where p_max does not settle it, the verdict rests on θ's own interval
        assert theta["verdict"] in ("agrees", "disagrees", "inconclusive")
    assert theta["ci_low"] <= theta["statistic"] <= theta["ci_high"]
    assert theta["n_sequences"] >= 2
