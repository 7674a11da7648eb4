"""The study pipeline end to end on a micro GPT: train seeds, audit checkpoints, Parquet, report, resume."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from attnsens.cli import app
from attnsens.errors import CheckpointError, ConfigError
from attnsens.store import Manifest, read_table
from attnsens.store.query import query
from attnsens.study.study import StudyConfig, run_study
from attnsens.train.model import GPTConfig
from attnsens.train.trainer import TrainConfig
from tests.helpers.study import micro_study
from tests.unit.train.conftest import synthetic_text

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class StopAt:
    """A log sink that interrupts the study when a given message starts, as a kill would."""

    def __init__(self, prefix: str | None) -> None:
        self.prefix, self.lines = prefix, []

    def __call__(self, message: str) -> None:
        self.lines.append(message)
        if self.prefix is not None and message.startswith(self.prefix):
            raise KeyboardInterrupt


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("study_corpus") / "verse.txt"
    path.write_text(synthetic_text(6000))
    return path


def test_killed_study_resumes_without_loss_or_duplicates(corpus: Path, tmp_path: Path) -> None:
    config = micro_study(corpus)
    first = StopAt("pre seed 1 step 1:")
    with pytest.raises(KeyboardInterrupt):
        run_study(config, tmp_path, log=first)
    before = {p: p.read_bytes() for p in (tmp_path / "rows").rglob("*.parquet")}
    assert len(before) == 6  # seed 0: steps 0, 1, 2, 4; seed 1: steps 0, 1

    second = StopAt(None)
    result = run_study(config, tmp_path, log=second)
    assert [line.split(":")[0] for line in second.lines] == [
        "pre seed 0", "pre seed 1", "pre seed 1 step 2", "pre seed 1 step 4",
    ]  # fmt: skip
    assert all(path.read_bytes() == data for path, data in before.items())
    assert result.report == tmp_path / "report.html" and result.report.stat().st_size > 10_000

    counts = query(tmp_path, "SELECT seed, step, count(*) AS n FROM rows GROUP BY seed, step ORDER BY seed, step")
    assert counts[["seed", "step"]].values.tolist() == [[s, t] for s in (0, 1) for t in (0, 1, 2, 4)]
    assert set(counts["n"]) == {2 * 5 * 2 * 2}  # sequences × rows × layers × heads
    duplicates = query(
        tmp_path,
        "SELECT count(*) AS n FROM (SELECT run_id, step, seed, layer, head, batch, query, count(*) AS c "
        "FROM rows GROUP BY ALL HAVING c > 1)",
    )
    assert duplicates["n"].item() == 0
    training = read_table(tmp_path / "training")
    assert sorted(training["seed"].unique()) == [0, 1] and len(training) == 8
    bounds = read_table(tmp_path / "bounds")
    assert sorted(bounds["step"].unique()) == [0, 1, 2, 4]
    summary = read_table(tmp_path / "summary")
    layer_rows = summary[summary["head"] == -1]
    assert len(layer_rows) == 2 * 4 * 2 and layer_rows["theta_lower_median"].between(0, 1).all()

    third = StopAt(None)
    run_study(config, tmp_path, log=third)
    assert third.lines == ["pre seed 0: already trained (4 steps)", "pre seed 1: already trained (4 steps)"]


def test_corrupted_checkpoint_and_changed_config_are_reported(corpus: Path, tmp_path: Path) -> None:
    config = micro_study(corpus, seeds=(3,), bounds=False)
    run_study(config, tmp_path)
    assert not (tmp_path / "bounds").exists()
    weights = tmp_path / "runs" / "placement=pre" / "seed=3" / "checkpoints" / "step_000002" / "model.safetensors"
    raw = bytearray(weights.read_bytes())
    raw[-3] ^= 0xFF
    weights.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match=r"step_000002/model\.safetensors is corrupted"):
        run_study(config, tmp_path)
    weights.write_bytes(bytes(raw[:-3] + bytes([raw[-3] ^ 0xFF]) + raw[-2:]))  # restored
    with pytest.raises(ConfigError, match=r"different config \(keys \['train'\] differ\)"):
        run_study(micro_study(corpus, seeds=(3,), bounds=False, train=TrainConfig(steps=5, batch_size=4)), tmp_path)
    with pytest.raises(ConfigError, match=r"can only grow: give every recorded item again \(seeds \[3\]\)"):
        run_study(micro_study(corpus, seeds=(4,), bounds=False), tmp_path)


def test_a_study_takes_an_extra_seed_and_keeps_what_it_has(corpus: Path, tmp_path: Path) -> None:
    """Seeds 0 then 0,1 in one folder: seed 0's checkpoints and audit files are verified and kept byte for byte,
    only seed 1 trains and is audited, and the rebuilt report covers both."""
    run_study(micro_study(corpus, seeds=(0,), bounds=False), tmp_path)
    kept = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file() and "seed=0" in str(p)}
    assert any(p.suffix == ".safetensors" for p in kept) and any(p.suffix == ".parquet" for p in kept)
    log = StopAt(None)
    result = run_study(micro_study(corpus, seeds=(0, 1), bounds=False), tmp_path, log=log)
    assert log.lines[0] == "pre seed 0: already trained (4 steps)"
    # Only seed 1 trains (its checkpoint lines) and is audited (one line per checkpoint); seed 0 is not touched.
    labels = [line.split(":")[0] for line in log.lines[1:]]
    assert set(labels) == {"pre seed 1"} | {f"pre seed 1 step {t}" for t in (0, 1, 2, 4)}
    assert all(path.read_bytes() == data for path, data in kept.items())
    assert Manifest.load(tmp_path).config["seeds"] == [0, 1]
    steps = query(tmp_path, "SELECT DISTINCT seed, step FROM rows ORDER BY seed, step")
    assert steps.values.tolist() == [[s, t] for s in (0, 1) for t in (0, 1, 2, 4)]
    assert "seeds 0, 1" in result.report.read_text()
    with pytest.raises(ConfigError, match="can only grow"):
        run_study(micro_study(corpus, seeds=(1,), bounds=False), tmp_path)


def test_invalid_study_settings() -> None:
    with pytest.raises(ConfigError, match="distinct"):
        micro_study(Path("x"), seeds=(1, 1))
    with pytest.raises(ConfigError, match="rows_per_sequence"):
        micro_study(Path("x"), rows_per_sequence=13)
    result = CliRunner().invoke(app, ["study", "--seeds", "0,x", "--out", "unused"])
    assert result.exit_code == 1 and "comma-separated integers" in result.output


def test_placements_side_by_side_with_baselines_and_a_pretrained_reference(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tokenizers import Tokenizer

    from attnsens.models import loading
    from attnsens.models.own_gpt import OwnGPTAdapter
    from attnsens.train.model import GPT

    reference_model = GPTConfig(vocab_size=300, n_layer=3, n_head=2, d_model=16, d_ff=24, max_positions=32)

    def reference(**_: object) -> OwnGPTAdapter:
        tokenizer = Tokenizer.from_file(str(tmp_path / "data" / "tokenizer.json"))
        return OwnGPTAdapter(GPT(reference_model), name="micro-reference", tokenizer=tokenizer)

    monkeypatch.setitem(loading.ALIASES, "micro-reference", reference)
    config = micro_study(
        corpus,
        placements=("pre", "post"),
        seeds=(0,),
        reference="micro-reference",
        placement_train={"post": {"lr": 1e-3}},
    )
    run_study(config, tmp_path)
    assert (tmp_path / "runs" / "placement=post" / "seed=0" / "checkpoints").is_dir()
    peak_lr = query(tmp_path, "SELECT run_id, max(lr) AS lr FROM training GROUP BY 1").set_index("run_id")["lr"]
    assert peak_lr.to_dict() == pytest.approx({"micro-pre": 3e-3, "micro-post": 1e-3})
    per_run = query(tmp_path, "SELECT run_id, step, count(*) AS n FROM rows GROUP BY ALL ORDER BY ALL")
    trained = per_run[per_run["run_id"] != "reference-micro-reference"]
    assert trained[["run_id", "step"]].values.tolist() == [
        [run, step] for run in ("micro-post", "micro-pre") for step in (0, 1, 2, 4)
    ]
    reference_rows = per_run[per_run["run_id"] == "reference-micro-reference"]
    assert reference_rows["step"].tolist() == [0] and reference_rows["n"].item() == 2 * 5 * 3 * 2
    placements = query(tmp_path, "SELECT DISTINCT run_id, norm_placement FROM bounds WHERE head = -1 ORDER BY 1")
    assert placements.values.tolist() == [["micro-post", "post_ln"], ["micro-pre", "pre_ln"]]
    baselines = read_table(tmp_path / "baselines").set_index(["run_id", "name"])
    unigram, bigram = baselines.loc[("micro", "unigram"), "eval_loss"], baselines.loc[("micro", "bigram"), "eval_loss"]
    assert 0 < bigram < unigram  # a bigram fitted on the text beats its unigram
    sizes = baselines.xs("model", level="name")["n_parameters"]
    assert sizes["micro-pre"] == sum(p.numel() for p in GPT(config.model_for("pre")).parameters())

    # The report never averages two placements together: per-run figures, and per-run rows in the bound table.
    from attnsens.report import build_report
    from attnsens.report.data import load_run
    from attnsens.report.html_parts import fmt
    from attnsens.report.sections import bounds_section, placements_section

    html = build_report(tmp_path).read_text(encoding="utf-8")
    for title in ("Certified bounds", "Layer × head", "Gradient norms by parameter group", "LayerNorm condition"):
        for run in ("micro-pre", "micro-post"):
            assert f'alt="{title}, {run}"' in html, (title, run)
    data = load_run(tmp_path)
    body = bounds_section(data).body.split("The rest of each block")[0]  # the attention table
    layer = data.bounds[(data.bounds["head"] == -1) & (data.bounds["step"] == 4)]
    for run in ("micro-pre", "micro-post"):
        expected = layer.loc[layer["run_id"] == run, "mha_local_jacobian_upper_bound"].groupby(layer["layer"]).mean()
        for index, value in expected.items():
            (row,) = [r for r in re.findall(r"<tr>(.*?)</tr>", body) if r.startswith(f"<td>{run}</td><td>{index}</td>")]
            assert f"<td>{fmt(value)}</td>" in row, (run, index, row)
    assert "micro-post warms up over 2 steps to a peak of 0.001" in placements_section(data).body


def test_each_placement_trains_with_its_own_warmup_and_peak_learning_rate() -> None:
    """The tiny preset trains Post-LN and DeepNorm to 2e-3 after 300 warmup steps (with Pre-LN's 60 steps to 6e-3
    its Post-LN stays at the unigram loss); an explicit setting is every placement's, and a study of one placement
    records no per-placement settings."""
    both = StudyConfig.from_preset("tiny", placements=("pre", "post"))
    pre, post = both.train_for("pre"), both.train_for("post")
    assert (pre.lr, pre.warmup_steps, post.lr, post.warmup_steps) == (6e-3, 60, 2e-3, 300)
    assert (pre.steps, pre.batch_size) == (post.steps, post.batch_size) == (1200, 16)
    assert both.describe()["placement_train"] == {"post": {"lr": 2e-3, "warmup_steps": 300}}
    assert "placement_train" not in StudyConfig.from_preset("tiny").describe()  # as recorded before there were any
    explicit = StudyConfig.from_preset("tiny", placements=("pre", "post"), lr=1e-3)
    assert explicit.train_for("post").lr == explicit.train_for("pre").lr == 1e-3
    assert explicit.train_for("post").warmup_steps == 300
    mixed = StudyConfig.from_preset("tiny", placements=("pre", "post"), placement_train={"post": {"lr": 3e-3}})
    assert (mixed.train_for("post").lr, mixed.train_for("post").warmup_steps) == (3e-3, 300)
    with pytest.raises(ConfigError, match="need lr > 0"):
        micro_study(Path("x"), placements=("pre", "post"), placement_train={"post": {"lr": -1.0}})
    with pytest.raises(ConfigError, match="cannot have its own steps: every placement shares"):
        micro_study(Path("x"), placement_train={"pre": {"steps": 8}})
    with pytest.raises(ConfigError, match=r"GPTConfig\.norm must be one of"):
        micro_study(Path("x"), placement_train={"pst": {"lr": 1e-3}})
    result = CliRunner().invoke(app, ["study", "--lr", "pre=fast", "--out", "unused"])
    assert result.exit_code == 1 and "--lr must be a number such as 6e-3 or pairs" in result.output


def test_bounds_every_stride_checkpoints_and_always_the_last() -> None:
    config = micro_study(Path("x"), bound_stride=2)  # checkpoints 0, 1, 2, 4
    assert [step for step in config.train.checkpoint_schedule if config.bounds_at(step)] == [0, 2, 4]
    assert not any(map(micro_study(Path("x"), bounds=False).bounds_at, (0, 4)))
    with pytest.raises(ConfigError, match="bound_stride"):
        micro_study(Path("x"), bound_stride=0)


@pytest.mark.slow
def test_cli_study_with_an_extra_seed_trains_only_that_seed(corpus: Path, tmp_path: Path) -> None:
    """`attnsens study --seeds 0` then `--seeds 0,1` on the same --out (tiny preset, 2 steps)."""
    args = ["study", "--out", str(tmp_path), "--steps", "2", "--data", str(corpus), "--no-bounds"]
    first = CliRunner().invoke(app, [*args, "--seeds", "0"])
    assert first.exit_code == 0, first.output
    second = CliRunner().invoke(app, [*args, "--seeds", "0,1"])
    assert second.exit_code == 0, second.output
    assert "pre seed 0: already trained (2 steps)" in second.output
    assert "pre seed 0 step" not in second.output and "pre seed 1 step 2:" in second.output
    assert second.output.strip().splitlines()[-1] == str(tmp_path / "report.html")
    assert "seeds 0, 1" in (tmp_path / "report.html").read_text()
