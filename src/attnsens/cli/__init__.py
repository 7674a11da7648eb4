"""Command-line interface: ``attnsens <command>``; one module per command."""

from __future__ import annotations

# Importing a command module registers its command on ``app``.
from attnsens.cli import audit as _audit  # noqa: F401  (registers `audit`)
from attnsens.cli import bounds as _bounds  # noqa: F401  (registers `bounds`)
from attnsens.cli import influence as _influence  # noqa: F401  (registers `influence`)
from attnsens.cli import query as _query  # noqa: F401  (registers `query`)
from attnsens.cli import report as _report  # noqa: F401  (registers `report`)
from attnsens.cli import study as _study  # noqa: F401  (registers `study`)
from attnsens.cli import theta as _theta  # noqa: F401  (registers `theta`)
from attnsens.cli import train as _train  # noqa: F401  (registers `train`)
from attnsens.cli import verify as _verify  # noqa: F401  (registers `verify`)
from attnsens.cli import version as _version  # noqa: F401  (registers `version`)
from attnsens.cli import warmup as _warmup  # noqa: F401  (registers `warmup`)
from attnsens.cli.app import app


def main() -> None:
    app()


__all__ = ["app", "main"]
