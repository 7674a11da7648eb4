"""Provenance recorded with every output: package versions, git SHA, argv, time."""

from __future__ import annotations

import datetime as _dt
import functools
import importlib.metadata
import platform
import subprocess
import sys
from pathlib import Path

_PACKAGES = ("attnsens", "torch", "numpy", "numba", "transformers", "pyarrow", "duckdb")


@functools.cache
def git_sha() -> str | None:
    """The commit of the attnsens source tree, with ``-dirty`` if it has local changes; None outside git.

    Read once per process (two git calls, about 5 ms): the code that runs is the code imported at its start, and
    an audit records provenance in each file it writes."""
    root = Path(__file__).resolve().parents[2]
    if not (root / ".git").exists():
        return None
    try:
        sha = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, check=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{sha}-dirty" if dirty else sha


def package_versions() -> dict[str, str]:
    """Installed versions of the packages whose behaviour shapes results (read once per process)."""
    return dict(_package_versions())


@functools.cache
def _package_versions() -> dict[str, str]:
    versions = {}
    for name in _PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return versions


def provenance() -> dict[str, object]:
    """Everything needed to tell where a result came from."""
    return {
        "argv": list(sys.argv),
        "git_sha": git_sha(),
        "versions": package_versions(),
        "python": platform.python_version(),
        "created_utc": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
    }
