"""The audit's rows table as it is collected (``RowColumns``): the blocks' statistics copied into one array per
column in the schema's dtypes, grown when more rows arrive than announced."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnsens.capture.statistics import row_statistics
from attnsens.capture.stream import RowBlock
from attnsens.store.schema import ROWS
from attnsens.study.auditing import RowColumns
from tests.unit.theta.rows import softmax_rows


def blocks() -> list[RowBlock]:
    out = []
    for layer in range(3):
        for first in (0, 5):
            rows = softmax_rows(2 * 3 * 5, 12, 1.0 + layer, seed=layer * 10 + first).reshape(2, 3, 5, 12)
            positions = torch.arange(first, first + 5).expand(2, -1)
            out.append(RowBlock(layer=layer, heads=(0, 2, 4), query_positions=positions, stats=row_statistics(rows)))
    return out


@pytest.mark.parametrize("capacity", [0, 7, 180, 1000], ids=["none", "grown", "exact", "more"])
def test_columns_hold_every_block_in_order_in_the_schema_dtypes(capacity: int) -> None:
    collected = RowColumns(capacity=capacity)
    parts = blocks()
    for block in parts:
        collected.add(block)
    frame = collected.frame(run_id="r", model="m", step=3, seed=1, batch_offset=4)
    assert len(frame) == 180 and collected.layers == [0, 1, 2]
    for name in parts[0].columns():
        expected = np.concatenate([block.columns()[name].numpy() for block in parts])
        if name == "batch":
            expected = expected + 4
        column = frame[name].to_numpy()
        assert column.dtype == np.dtype(ROWS.column(name).dtype.to_pandas_dtype()), name
        np.testing.assert_array_equal(column, expected.astype(column.dtype), err_msg=name)
    assert (frame["step"] == 3).all() and (frame["run_id"] == "r").all()
