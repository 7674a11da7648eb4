"""The study under torchrun: two gloo ranks train each seed together and share the checkpoint audits."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from attnsens.store import read_table
from tests.integration.launch import run_torchrun_and_single

SCRIPT = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from attnsens.study.study import run_study
    from tests.helpers.study import micro_study

    run_study(micro_study(Path(sys.argv[1])), sys.argv[2])
    """
)


@pytest.mark.slow
def test_torchrun_study_matches_the_single_process_tables(tmp_path: Path) -> None:
    ddp_dir, single_dir = run_torchrun_and_single(SCRIPT, tmp_path, timeout=300)

    assert (ddp_dir / "report.html").exists()
    for table in ("rows", "summary", "training"):
        ddp, single = read_table(ddp_dir / table), read_table(single_dir / table)
        key = [c for c in ("seed", "step", "layer", "head", "batch", "query") if c in ddp.columns]
        ddp, single = ddp.sort_values(key).reset_index(drop=True), single.sort_values(key).reset_index(drop=True)
        assert ddp[key].equals(single[key]), table
    losses_ddp = read_table(ddp_dir / "training")["loss"].to_numpy()
    losses_single = read_table(single_dir / "training")["loss"].to_numpy()
    assert abs(losses_ddp - losses_single).max() < 1e-4
