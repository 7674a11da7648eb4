"""SensitivityMonitor: probes every k steps in a plain loop, and logs through the HF Trainer and Lightning."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from attnsens.capture import RowSelection, SensitivityMonitor
from attnsens.errors import ConfigError
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


def _tiny_hf_trainer(tmp_path, model, callbacks=None):
    from transformers import Trainer, TrainingArguments

    class Blocks(torch.utils.data.Dataset):
        def __init__(self) -> None:
            self.ids = torch.randint(0, VOCAB, (8, 12), generator=torch.Generator().manual_seed(1))

        def __len__(self) -> int:
            return len(self.ids)

        def __getitem__(self, index: int) -> dict:
            return {"input_ids": self.ids[index], "labels": self.ids[index]}

    args = TrainingArguments(
        output_dir=str(tmp_path),
        max_steps=4,
        per_device_train_batch_size=2,
        learning_rate=1e-3,
        logging_steps=100,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    return Trainer(model=model, args=args, train_dataset=Blocks(), callbacks=callbacks)


def test_hf_trainer_logs_the_per_layer_figures_through_its_own_log(tmp_path) -> None:
    from transformers import TrainerCallback

    class Reporter(TrainerCallback):
        """Stands in for a report_to integration: records what on_log hands to every logger."""

        def __init__(self) -> None:
            self.logged: list[dict] = []

        def on_log(self, args, state, control, logs=None, **kwargs) -> None:
            self.logged.append(dict(logs or {}))

    model = tiny_model("gpt2").train()
    reporter = Reporter()
    trainer = _tiny_hf_trainer(tmp_path, model, callbacks=[reporter])
    monitor = SensitivityMonitor(
        torch.randint(0, VOCAB, (2, 12)), every=2, selection=RowSelection(sample_per_sequence=4)
    )
    monitor.attach(trainer)
    trainer.train()

    layers = model.config.n_layer
    entries = [entry for entry in trainer.state.log_history if any(key.startswith("attnsens/") for key in entry)]
    assert [entry["step"] for entry in entries] == [2, 4]
    names = ("theta_lower_median", "p_max_median", "entropy_mean", "fraction_dominant")
    expected_keys = {f"attnsens/layer_{layer}/{name}" for layer in range(layers) for name in names}
    for entry in entries:
        assert expected_keys <= entry.keys()
        assert entry == {**monitor.scalars(entry["step"]), **{k: v for k, v in entry.items() if "attnsens/" not in k}}
        for layer in range(layers):
            assert 0.0 <= entry[f"attnsens/layer_{layer}/theta_lower_median"] <= 1.0
            assert 0.0 < entry[f"attnsens/layer_{layer}/p_max_median"] <= 1.0
            assert entry[f"attnsens/layer_{layer}/entropy_mean"] >= 0.0
            assert 0.0 <= entry[f"attnsens/layer_{layer}/fraction_dominant"] <= 1.0
    # The layer's figures pool the rows of all its heads: 2 sequences × 4 rows × heads.
    assert {record["n_rows"] for record in monitor.layers} == {2 * 4 * model.config.n_head}
    reported = [logs for logs in reporter.logged if any(key.startswith("attnsens/") for key in logs)]
    assert [{k: v for k, v in logs.items() if k.startswith("attnsens/")} for logs in reported] == [
        monitor.scalars(2),
        monitor.scalars(4),
    ]


def test_hf_callback_without_a_trainer_warns_that_nothing_reaches_the_log(tmp_path) -> None:
    model = tiny_model("gpt2").train()
    monitor = SensitivityMonitor(torch.randint(0, VOCAB, (1, 12)), every=2)
    trainer = _tiny_hf_trainer(tmp_path, model, callbacks=[monitor.trainer_callback()])
    with pytest.warns(UserWarning, match=r"monitor\.attach\(trainer\)"):
        trainer.train()
    assert sorted({record["step"] for record in monitor.layers}) == [2, 4]
    assert not any(key.startswith("attnsens/") for entry in trainer.state.log_history for key in entry)


def test_lightning_callback_logs_through_log_dict() -> None:
    pl = pytest.importorskip("lightning.pytorch")

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = tiny_model("gpt2").train()

        def training_step(self, batch, batch_idx):
            return self.model(input_ids=batch, labels=batch).loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=1e-3)

    data = torch.utils.data.DataLoader(torch.randint(0, VOCAB, (8, 12)), batch_size=2)
    monitor = SensitivityMonitor(torch.randint(0, VOCAB, (1, 12)), every=2)
    trainer = pl.Trainer(
        max_steps=4, callbacks=[monitor.lightning_callback()], logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
    )  # fmt: skip
    trainer.fit(Module(), data)
    assert sorted({record["step"] for record in monitor.layers}) == [2, 4]
    assert {key: float(value) for key, value in trainer.logged_metrics.items()} == pytest.approx(monitor.scalars(4))


def test_lightning_callback_names_the_package_when_it_is_missing() -> None:
    import importlib.util

    if importlib.util.find_spec("lightning") or importlib.util.find_spec("pytorch_lightning"):
        pytest.skip("PyTorch Lightning is installed")
    with pytest.raises(ConfigError, match="pip install lightning"):
        SensitivityMonitor(torch.randint(0, VOCAB, (1, 4))).lightning_callback()
