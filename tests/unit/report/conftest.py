"""A synthetic run directory shared by the report tests (built once per session)."""

from __future__ import annotations

import pytest

from tests.unit.store.synthetic import write_synthetic_run

HOSTILE_MODEL = 'tiny <script>alert("x")</script> & co'


@pytest.fixture(scope="session")
def run_dir(tmp_path_factory):
    return write_synthetic_run(tmp_path_factory.mktemp("run"), model=HOSTILE_MODEL)


@pytest.fixture(scope="session")
def report_path(run_dir):
    from attnsens.report import build_report

    return build_report(run_dir)
