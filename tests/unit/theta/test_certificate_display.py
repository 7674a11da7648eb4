"""ThetaCertificate for people: a one-line repr, and to_pandas with the coordinates and the audit's column names."""

from __future__ import annotations

import pytest
import torch

from attnsens.errors import ShapeError
from attnsens.store.schema import ROWS
from attnsens.theta import certify
from tests.unit.theta.rows import softmax_rows


def test_repr_is_one_short_line() -> None:
    cert = certify(softmax_rows(2 * 3 * 5, 7, 2.0, seed=1).reshape(2, 3, 5, 7))
    text = repr(cert)
    assert "\n" not in text and len(text) < 160
    assert text.startswith("ThetaCertificate(shape=(2, 3, 5), lower∈[") and "exact=" in text and "device=cpu" in text


def test_to_pandas_coordinates_and_columns() -> None:
    p = softmax_rows(2 * 3 * 5, 7, 2.0, seed=2).reshape(2, 3, 5, 7)
    cert = certify(p)
    table = cert.to_pandas()
    assert len(table) == 2 * 3 * 5
    assert list(table.columns[:3]) == ["batch", "head", "query"]
    audit_columns = {column.name for column in ROWS.columns}
    assert set(table.columns) <= audit_columns  # the same names as the audit's rows table
    row = table[(table["batch"] == 1) & (table["head"] == 2) & (table["query"] == 4)].iloc[0]
    assert row["theta_lower"] == float(cert.lower[1, 2, 4]) and row["theta_method"] == int(cert.method[1, 2, 4])
    assert list(cert[0].to_pandas().columns[:2]) == ["head", "query"]
    with pytest.raises(ShapeError, match="got 1 axis names for the 3 leading axes"):
        cert.to_pandas(axes=("row",))
    assert list(cert.to_pandas(axes=("b", "h", "t")).columns[:3]) == ["b", "h", "t"]


def test_four_leading_axes_are_numbered() -> None:
    cert = certify(torch.full((2, 1, 1, 3, 2), 0.5))
    assert list(cert.to_pandas().columns[:4]) == ["axis_0", "axis_1", "axis_2", "axis_3"]
