"""The study under torchrun: two gloo ranks train each seed together and share the checkpoint audits."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from attnsens.store import read_table
from tests.integration.launch import run_torchrun_and_single
from tests.unit.train.conftest import synthetic_text

SCRIPT = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from attnsens.study.study import run_study
    from tests.integration.test_study import micro_study

    run_study(micro_study(Path(sys.argv[1])), sys.argv[2])
    """
)


@pytest.mark.slow
def test_torchrun_study_matches_the_single_process_tables(tmp_path: Path) -> None:
    corpus = tmp_path / "verse.txt"
    corpus.write_text(synthetic_text(6000))
    script = tmp_path / "study_micro.py"
    script.write_text(SCRIPT)
    run_torchrun_and_single(script, corpus, tmp_path / "ddp", tmp_path / "single", timeout=300)

    assert (tmp_path / "ddp" / "report.html").exists()
    for table in ("rows", "summary", "training"):
        ddp, single = read_table(tmp_path / "ddp" / table), read_table(tmp_path / "single" / table)
        key = [c for c in ("seed", "step", "layer", "head", "batch", "query") if c in ddp.columns]
        ddp, single = ddp.sort_values(key).reset_index(drop=True), single.sort_values(key).reset_index(drop=True)
        assert ddp[key].equals(single[key]), table
    losses_ddp = read_table(tmp_path / "ddp" / "training")["loss"].to_numpy()
    losses_single = read_table(tmp_path / "single" / "training")["loss"].to_numpy()
    assert abs(losses_ddp - losses_single).max() < 1e-4
