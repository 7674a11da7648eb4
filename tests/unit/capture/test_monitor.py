"""SensitivityMonitor: probes every k steps in a plain loop and through the HF TrainerCallback protocol."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from attnsens.capture import RowSelection, SensitivityMonitor
from tests.unit.models.tiny_models import VOCAB, tiny_model


def test_plain_loop_records_every_k_steps_without_touching_training() -> None:
    model = tiny_model("gpt2").train()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    probe = torch.randint(0, VOCAB, (2, 13))
    monitor = SensitivityMonitor(probe, every=3, selection=RowSelection(sample_per_sequence=4))
    assert repr(monitor) == "SensitivityMonitor(probe_ids=2×13, every=3, probes=0 (nothing yet), seconds=0)"
    probed = []
    for step in range(7):
        batch = torch.randint(0, VOCAB, (2, 13))
        loss = model(input_ids=batch, labels=batch).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        before = [p.detach().clone() for p in model.parameters()]
        probed.append(monitor.on_step_end(step, model))
        assert model.training
        assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert probed == [True, False, False, True, False, False, True]
    assert sorted({r["step"] for r in monitor.history}) == [0, 3, 6]
    assert len(monitor.history) == 3 * 2 * 3  # steps × layers × heads
    assert all(r["n_rows"] == 2 * 4 for r in monitor.history)
    assert all(0.0 <= r["theta_lower_median"] <= 1.0 for r in monitor.history)
    assert monitor.seconds > 0
    assert repr(monitor).startswith("SensitivityMonitor(probe_ids=2×13, every=3, probes=3 (steps 0–6), seconds=")


def test_trainer_callback_probes_on_global_step() -> None:
    from transformers import TrainerCallback

    model = tiny_model("llama")
    monitor = SensitivityMonitor(torch.randint(0, VOCAB, (1, 11)), every=2)
    callback = monitor.trainer_callback()
    assert isinstance(callback, TrainerCallback)
    for step in (1, 2, 3, 4):
        callback.on_step_end(args=None, state=SimpleNamespace(global_step=step), control=None, model=model)
    assert sorted({r["step"] for r in monitor.history}) == [2, 4]
