"""The θ kernels that other parts of attnsens call: the one way into the compiled θ cascade from outside ``theta``.

Package-internal (not part of the user API of ``attnsens.theta``). Its users:

* ``capture._numba_row_statistics``, the audit's one-pass row statistics, runs the cascade on its own blocks of
  rows (``certify_block``, ``ROW_BLOCK``, ``blocks_per_task``, ``thread_workspace``) and encloses θ row by row
  (``theta_interval``); ``capture.statistics`` sizes its workspaces and tasks (``thread_workspaces``,
  ``chunk_tasks``) and reports invalid rows as ``certify`` does (``raise_for_status``);
* ``capture._numba_moments`` reads a row's support as the θ scan does (``support_end``);
* ``capture.stream`` shares the enumeration workspaces across an audit's chunks (``holding_workspaces``);
* ``warmup`` compiles the entry kernels (``certify_rows``, ``certify_rows_serial``).

The compiled functions are theta's own numba dispatchers under public names, not copies, so a kernel of capture
calls them from its compiled code. Outside ``theta`` nothing imports a private module or name of it
(``tests/unit/test_layers.py``). Importing this module imports numba; ``import attnsens.theta`` does not import it.
Its content is hashed into the kernels' cache folder (``attnsens._numba_cache.COMPILED_CONSTANTS``): a kernel
compiled against a name here must be recompiled when the name is bound to another function.
"""

from __future__ import annotations

from attnsens.theta._numba_enclosure import theta_interval
from attnsens.theta._numba_kernels import (
    ROW_BLOCK,
    blocks_per_task,
    certify_rows,
    certify_rows_serial,
    chunk_tasks,
    holding_workspaces,
    thread_workspace,
    thread_workspaces,
)
from attnsens.theta._numba_kernels import _certify_block as certify_block
from attnsens.theta._numba_scan import _support_end as support_end
from attnsens.theta._validation import raise_for_status

__all__ = [
    "ROW_BLOCK",
    "blocks_per_task",
    "certify_block",
    "certify_rows",
    "certify_rows_serial",
    "chunk_tasks",
    "holding_workspaces",
    "raise_for_status",
    "support_end",
    "theta_interval",
    "thread_workspace",
    "thread_workspaces",
]
