"""A writer process for the fault tests: ``python -m tests.integration.fault_worker KIND CORPUS OUT``.

KIND is ``study`` (the micro study of test_study.py), ``train`` (one micro training run) or ``audit`` (a tiny
GPT-2 audited sequence by sequence). It prints ``ready`` once its imports are done, so that a test can kill it
(SIGKILL) a chosen time into the real work.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch


def main(kind: str, corpus: Path, out: Path) -> None:
    torch.set_num_threads(1)
    if kind == "study":
        from attnsens.study.study import run_study
        from tests.helpers.study import micro_study

        config = micro_study(corpus)
        print("ready", flush=True)
        run_study(config, out, device="cpu")
    elif kind == "train":
        from attnsens.train.data import DataConfig
        from attnsens.train.run import train
        from attnsens.train.trainer import TrainConfig
        from tests.unit.train.conftest import micro_model_config

        print("ready", flush=True)
        train(
            micro_model_config(),
            TrainConfig(steps=16, batch_size=4, lr=3e-3, warmup_steps=3, seed=7),
            DataConfig(source=str(corpus), vocab_size=300, block_size=16, eval_sequences=3),
            out,
            resume=True,
            device="cpu",
        )
    elif kind == "audit":
        from attnsens.capture import RowSelection
        from attnsens.study.auditing import audit
        from tests.unit.models.tiny_models import VOCAB, tiny_model

        model = tiny_model("gpt2")
        tokens = torch.randint(0, VOCAB, (12 * 31,), generator=torch.Generator().manual_seed(5))
        print("ready", flush=True)
        audit(model, tokens, seq_len=31, out_dir=out, selection=RowSelection(sample_per_sequence=9, seed=2))
    else:
        raise SystemExit(f"unknown kind {kind!r}; use study, train or audit")


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]))
