"""DDP: two gloo processes under torchrun train the single-process run's global batch; rank 0 alone writes."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pandas as pd
import pytest
import torch

from attnsens.train.checkpoint import load_model_state
from tests.integration.launch import run_torchrun_and_single

SCRIPT = textwrap.dedent(
    """
    import sys
    from attnsens.train.data import DataConfig
    from attnsens.train.model import GPTConfig
    from attnsens.train.run import train
    from attnsens.train.trainer import TrainConfig

    corpus, out = sys.argv[1], sys.argv[2]
    train(
        GPTConfig(vocab_size=300, n_layer=2, n_head=2, d_model=16, d_ff=24, max_positions=16),
        TrainConfig(steps=6, batch_size=4, lr=3e-3, warmup_steps=2, seed=3),
        DataConfig(source=corpus, vocab_size=300, block_size=16, eval_sequences=3),
        out,
        run_id="ddp",
        device="cpu",
    )
    """
)


def test_torchrun_two_processes_match_single_process(tmp_path: Path) -> None:
    ddp_dir, single_dir = run_torchrun_and_single(SCRIPT, tmp_path, timeout=180)

    ddp = pd.read_parquet(ddp_dir / "training.parquet")
    single = pd.read_parquet(single_dir / "training.parquet")
    torch.testing.assert_close(
        torch.tensor(ddp["loss"].values), torch.tensor(single["loss"].values), rtol=1e-4, atol=1e-5
    )
    torch.testing.assert_close(
        torch.tensor(ddp["grad_norm_global"].values),
        torch.tensor(single["grad_norm_global"].values),
        rtol=1e-4,
        atol=1e-6,
    )
    final_ddp, final_single = load_model_state(ddp_dir, 6), load_model_state(single_dir, 6)
    for name, tensor in final_single.items():
        torch.testing.assert_close(final_ddp[name], tensor, rtol=1e-4, atol=1e-5)
    manifest = json.loads((ddp_dir / "checkpoints" / "manifest.json").read_text())
    assert sorted(entry["step"] for entry in manifest.values()) == [0, 1, 2, 4, 6]
    leftovers = [p.name for p in (ddp_dir / "checkpoints").iterdir() if p.name.startswith(".")]
    assert leftovers == []


if not hasattr(torch.distributed, "is_available") or not torch.distributed.is_available():
    pytestmark = pytest.mark.skip(reason="torch.distributed is not available in this build")
