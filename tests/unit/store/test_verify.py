"""Verified reads: report, query and `attnsens verify` name every unit that disagrees with the manifest."""

from __future__ import annotations

import json
import shutil

import pytest
from typer.testing import CliRunner

from attnsens.cli import app
from attnsens.errors import FileFormatError, RunIntegrityError
from attnsens.report import build_report
from attnsens.store import Manifest, sha256_file
from attnsens.store import manifest as manifest_module
from attnsens.store.query import query
from attnsens.store.verify import CACHE_NAME, forget_untrusted, verify_run
from tests.unit.store.synthetic import SEEDS, STEPS, write_synthetic_run

runner = CliRunner()
ROWS_10 = "rows/seed=1/step=000010.parquet"


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    return write_synthetic_run(tmp_path_factory.mktemp("pristine"))


@pytest.fixture
def run(pristine, tmp_path):
    return shutil.copytree(pristine, tmp_path / "run")


def _counts(run_dir, **options):
    return query(run_dir, "SELECT seed, step FROM rows GROUP BY ALL ORDER BY ALL", **options).values.tolist()


def test_a_clean_folder_verifies_and_reads(run):
    check = verify_run(run)
    assert check.ok and check.verified == 6 * 2 + 4
    assert len(_counts(run)) == len(SEEDS) * len(STEPS)
    result = runner.invoke(app, ["verify", str(run)])
    assert result.exit_code == 0 and "16 unit(s) match manifest.json" in result.output


def test_a_deleted_unit_stops_report_and_query_until_forced(run):
    (run / ROWS_10).unlink()
    with pytest.raises(RunIntegrityError, match=rf"1 missing \({ROWS_10}\).*--force"):
        query(run, "SELECT 1")
    with pytest.raises(RunIntegrityError, match="missing"):
        build_report(run)
    assert [1, 10] not in _counts(run, force=True)
    text = build_report(run, force=True).read_text(encoding="utf-8")
    banner = text.split('class="integrity-banner"')[1].split("</div>")[0]
    assert "missing" in banner and ROWS_10 in banner


def test_a_unit_copied_over_another_is_named_with_what_it_holds(run):
    shutil.copyfile(run / "rows/seed=1/step=000000.parquet", run / ROWS_10)
    check = verify_run(run)
    assert [(p.unit, p.kind) for p in check.problems] == [(ROWS_10, "misplaced")]
    assert "holds step 0, its path says 10" in check.message()


def test_an_edited_hash_in_the_manifest_is_a_changed_unit(run):
    payload = json.loads((run / "manifest.json").read_text())
    payload["units"][ROWS_10]["sha256"] = "0" * 64
    (run / "manifest.json").write_text(json.dumps(payload))
    with pytest.raises(RunIntegrityError, match=rf"1 changed \({ROWS_10} \(sha256 differs"):
        query(run, "SELECT 1")


def test_a_truncated_unit_is_named_and_does_not_block_other_tables(run):
    unit = run / "summary/seed=0/step=000100.parquet"
    unit.write_bytes(unit.read_bytes()[:100])
    with pytest.raises(RunIntegrityError, match=r"1 unreadable \(summary/seed=0/step=000100\.parquet \(cannot read"):
        query(run, "SELECT count(*) FROM rows")
    assert len(_counts(run, force=True)) == len(SEEDS) * len(STEPS)
    summary = query(run, "SELECT DISTINCT seed, step FROM summary", force=True)
    assert len(summary) == len(SEEDS) * len(STEPS) - 1


def test_an_extra_file_is_named(run):
    shutil.copyfile(run / ROWS_10, run / "rows/seed=1/step=000011.parquet")
    check = verify_run(run)
    assert [(p.unit, p.kind) for p in check.problems] == [("rows/seed=1/step=000011.parquet", "extra")]
    message = check.message()
    assert "rebuild with the command that wrote it" in message and "move it out of the folder" in message
    assert "remove" not in message and "delete" not in message  # the advice never deletes a result


def test_hashes_are_cached_by_stat_and_a_rewrite_is_rehashed(run, monkeypatch):
    verify_run(run)
    assert (run / CACHE_NAME).is_file()
    hashed = []
    real = manifest_module.sha256_file
    monkeypatch.setattr("attnsens.store.verify.sha256_file", lambda path: hashed.append(path) or real(path))
    assert verify_run(run).ok and hashed == []
    (run / ROWS_10).write_bytes((run / ROWS_10).read_bytes())  # new ctime: the cached hash no longer applies
    assert verify_run(run).ok and hashed == [run / ROWS_10]
    hashed.clear()
    assert verify_run(run, rehash=True).ok and len(hashed) == 16


def test_cli_names_each_problem_and_the_fix_and_forced_reads_warn(run):
    (run / ROWS_10).unlink()
    result = runner.invoke(app, ["verify", str(run)])
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert lines[0].split() == ["missing", ROWS_10]
    assert lines[-1].startswith("error:") and "--force" in lines[-1] and len(lines) == 2
    refused = runner.invoke(app, ["query", str(run), "SELECT 1"])
    assert refused.exit_code == 1 and len(refused.output.strip().splitlines()) == 1 and ROWS_10 in refused.output
    forced = runner.invoke(app, ["report", str(run), "--force"])
    assert forced.exit_code == 0 and "warning: read with --force: 1 missing" in forced.output
    as_json = runner.invoke(app, ["verify", str(run), "--json"])
    assert as_json.exit_code == 1 and json.loads(as_json.output)["problems"][0]["kind"] == "missing"


def test_a_folder_without_manifest_is_read_and_reported_unverified(pristine, tmp_path):
    loose = tmp_path / "loose"
    shutil.copytree(pristine / "bounds", loose / "bounds")
    check = verify_run(loose)
    assert check.ok and not check.has_manifest
    assert "Unverified" in build_report(loose).read_text(encoding="utf-8")
    assert "not verified" in runner.invoke(app, ["verify", str(loose)]).output
    (tmp_path / "nothing").mkdir()
    nothing = runner.invoke(app, ["verify", str(tmp_path / "nothing")])
    assert nothing.exit_code == 1 and "no manifest.json and no Parquet files" in nothing.output


@pytest.mark.parametrize(
    ("edit", "named"),
    [
        (lambda m: {**m, "units": []}, "'units' is list"),
        (lambda m: {**m, "units": {"../../../../etc/passwd": {"sha256": "0" * 64}}}, "not a relative path inside"),
        (lambda m: {**m, "units": {"/etc/passwd": {"sha256": "0" * 64}}}, "not a relative path inside"),
        (lambda m: {**m, "units": {ROWS_10: {"table": "rows"}}}, "has sha256 None"),
        (lambda m: {**m, "units": {ROWS_10: {**m["units"][ROWS_10], "num_rows": "9"}}}, "num_rows '9'"),
    ],
)
def test_a_malformed_manifest_is_refused_before_any_file_is_opened(run, monkeypatch, edit, named):
    payload = json.loads((run / "manifest.json").read_text())
    (run / "manifest.json").write_text(json.dumps(edit(payload)))
    monkeypatch.setattr("attnsens.store.verify.sha256_file", lambda path: pytest.fail(f"hashed {path}"))
    with pytest.raises(FileFormatError, match=f"is malformed: .*{named}.*; restore it"):
        verify_run(run)
    result = runner.invoke(app, ["report", str(run)])
    assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1


def _record_hash_of_its_file(run, unit):
    """Edit the manifest so that ``unit``'s recorded sha256 is that of the file now in its place."""
    payload = json.loads((run / "manifest.json").read_text())
    payload["units"][unit]["sha256"] = sha256_file(run / unit)
    (run / "manifest.json").write_text(json.dumps(payload))


@pytest.mark.parametrize(
    ("source", "holds"),
    [("rows/seed=1/step=000000.parquet", "step 0, its path says 10"), ("rows/seed=0/step=000010.parquet", "seed 0")],
)
def test_a_unit_moved_into_another_place_with_a_matching_hash_is_still_misplaced(run, source, holds):
    """The sha256 check alone passes: only the unit's contents against its key (step, seed) give it away."""
    (run / source).replace(run / ROWS_10)
    _record_hash_of_its_file(run, ROWS_10)
    check = verify_run(run, rehash=True)
    assert (ROWS_10, "misplaced") in [(p.unit, p.kind) for p in check.problems]
    assert f"{ROWS_10} (holds {holds}" in check.message()
    with pytest.raises(RunIntegrityError, match="misplaced"):
        query(run, "SELECT 1")
    with pytest.raises(RunIntegrityError, match="misplaced"):
        build_report(run)


def test_writers_forget_units_whose_contents_do_not_match_their_place(run):
    """Manifest.is_done trusts the hash, so a rerun would keep the moved unit without forget_untrusted."""
    (run / "rows/seed=1/step=000000.parquet").replace(run / ROWS_10)
    _record_hash_of_its_file(run, ROWS_10)
    truncated = run / "summary/seed=0/step=000100.parquet"
    truncated.write_bytes(truncated.read_bytes()[:100])
    _record_hash_of_its_file(run, "summary/seed=0/step=000100.parquet")
    manifest = Manifest.load(run)
    assert manifest.is_done(ROWS_10) and manifest.is_done("summary/seed=0/step=000100.parquet")
    notes = []
    forgotten = forget_untrusted(manifest, note=notes.append)
    assert sorted(p.unit for p in forgotten) == [
        "rows/seed=1/step=000010.parquet",
        "summary/seed=0/step=000100.parquet",
    ]
    assert len(notes) == 2 and notes[0].startswith("rebuilding rows/seed=1/step=000010.parquet (holds step 0")
    reloaded = Manifest.load(run)
    assert ROWS_10 not in reloaded.units and not reloaded.is_done(ROWS_10)
    assert reloaded.is_done("rows/seed=1/step=000100.parquet")  # the others stay recorded
    assert forget_untrusted(reloaded) == []


def _with_argv(run, argv):
    payload = json.loads((run / "manifest.json").read_text())
    payload["provenance"]["argv"] = argv
    (run / "manifest.json").write_text(json.dumps(payload))


@pytest.mark.parametrize(
    ("argv", "command"),
    [
        (
            ["/venv/lib/attnsens/__main__.py", "study", "--out", "/old/place", "--seeds", "0"],
            "study --out RUN --seeds 0",
        ),
        (["/venv/bin/attnsens", "study", "--out=/old/place"], "study --out=RUN"),
        (
            ["/venv/bin/attnsens", "audit", "minilm", "--corpus", "shakespeare"],
            "audit minilm --corpus shakespeare --out RUN",
        ),
    ],
)
def test_the_fix_is_the_writing_command_with_out_naming_the_checked_folder(run, argv, command):
    """The folder may have been moved or copied since it was written: the command must rebuild this one."""
    _with_argv(run, argv)
    (run / ROWS_10).unlink()
    expected = "`attnsens " + command.replace("RUN", str(run)) + "`"
    assert f"rebuild with {expected}, or pass --force" in verify_run(run).message()


def test_a_folder_written_by_another_program_gets_a_described_fix(run):
    _with_argv(run, ["/usr/bin/python", "my_script.py", "--out", "x"])
    (run / ROWS_10).unlink()
    assert f"rebuild with the command that wrote it (attnsens study/audit … --out {run})" in verify_run(run).message()


def test_a_folder_of_runs_is_refused_by_name_not_pooled(pristine, tmp_path):
    """A parent of run folders (e.g. runs/, where audits go by default) has no manifest of its own: report, query
    and verify name the runs it holds instead of reading all their tables as one unchecked run."""
    parent = tmp_path / "runs"
    for name in ("first", "second"):
        shutil.copytree(pristine, parent / name)
    (parent / "loose").mkdir()
    (parent / "loose" / "manifest.json").write_text('{"step_000000": {}}')  # a checkpoint index: no run manifest
    message = rf"'{parent}' is no run \(it has no manifest.json\) but holds 2 run folder\(s\): first, second; pass one"
    with pytest.raises(FileFormatError, match=message):
        verify_run(parent)
    with pytest.raises(FileFormatError, match=message):
        query(parent, "SELECT count(*) FROM rows")
    with pytest.raises(FileFormatError, match=message):
        build_report(parent)
    result = runner.invoke(app, ["report", str(parent)])
    assert result.exit_code == 1 and "holds 2 run folder(s): first, second" in result.output
    assert not (parent / "report.html").exists()
    assert len(_counts(parent / "first")) == len(SEEDS) * len(STEPS)  # each run reads as before


def test_the_python_query_of_an_incomplete_run_warns_naming_what_it_lacks(run):
    import warnings

    from attnsens.store.verify import IncompleteRunWarning

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _counts(run)  # complete: no warning
    manifest = Manifest.load(run)
    manifest.plan([*manifest.units, "rows/seed=2/step=000000.parquet"])
    with pytest.warns(IncompleteRunWarning, match=r"1 planned unit\(s\) absent \(rows/seed=2/step=000000.parquet\)"):
        assert _counts(run) == _counts(run, check=verify_run(run))
