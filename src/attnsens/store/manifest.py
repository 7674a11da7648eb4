"""``manifest.json`` of a run directory: config, provenance and every finished unit file with its sha256.

A unit of work (one checkpoint's audit, one seed's training log, ...) writes exactly one file, named by what it
holds (e.g. ``rows/seed=0/step=000100.parquet``). It is recorded in the manifest only after the file is
complete, so a rerun of an interrupted job skips units that are recorded *and* whose file still has the
recorded hash, and redoes the others: nothing is lost and nothing is duplicated.

The manifest is validated on every read (:func:`manifest_problem`): ``config``, ``provenance`` and ``units``
objects, and per unit a relative path inside the run directory (no ``..``, no absolute path), a 64-hex
``sha256`` and optional ``table``/``num_rows``. Nothing outside the run directory is ever opened or hashed.

Several processes (e.g. torchrun ranks) may record units into the same manifest: every update re-reads the
file under an exclusive lock and replaces it atomically.

A writer also records what it plans before it starts (:meth:`Manifest.plan`): every unit it will write and, for a
study, every training checkpoint by run folder. A folder whose planned units are not all recorded is incomplete —
still being written, or interrupted — and ``verify``, ``report`` and ``query`` name what is absent.

Layout::

    {"format": 1, "config": {...}, "provenance": {...},
     "units": {"rows/seed=0/step=000100.parquet": {"table": "rows", "sha256": "...", "num_rows": 1024,
                                                   "recorded_utc": "..."}},
     "planned": {"units": ["rows/seed=0/step=000100.parquet", ...],
                 "checkpoints": {"runs/placement=pre/seed=0": [0, 1, 2, 4, ...]}}}
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import json
import os
import re
from collections.abc import Callable, Collection, Iterator, Mapping
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from attnsens.errors import CheckpointError, ConfigError, FileFormatError
from attnsens.provenance import provenance
from attnsens.store.parquet import atomic_write, parquet_parts
from attnsens.store.schema import TableSchema

MANIFEST_NAME = "manifest.json"
_FORMAT = 1
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def _extends(recorded: Mapping[str, Any], wanted: Mapping[str, Any], differ: list[str], growable: Collection[str]):
    """True when ``wanted`` differs from ``recorded`` only in growable lists that keep every recorded item."""
    return all(
        key in growable
        and isinstance(recorded.get(key), list)
        and isinstance(wanted.get(key), list)
        and all(item in wanted[key] for item in recorded[key])
        for key in differ
    )


def _config_mismatch(
    directory: Path, scope: str | None, recorded: Mapping[str, Any], differ: list[str], growable: Collection[str]
) -> str:
    where = f" (scope {scope!r})" if scope is not None else ""
    message = f"{str(directory)!r} holds a run with a different config{where} (keys {differ} differ); "
    kept = [key for key in differ if key in growable]
    if kept and set(differ) <= set(growable):
        listed = "; ".join(f"{key} {recorded.get(key)}" for key in kept)
        return message + f"it can only grow: give every recorded item again ({listed}) and add new ones after them"
    return message + "use a new output directory or the original config to resume"


def sha256_file(path: str | os.PathLike[str], *, chunk_bytes: int = 1 << 20) -> str:
    """Hex sha256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(chunk_bytes):
            digest.update(chunk)
    return digest.hexdigest()


class Manifest:
    """The manifest of one run directory. Create or reopen it with :meth:`open`."""

    def __init__(self, run_dir: Path, payload: dict[str, Any], *, scope: str | None = None) -> None:
        self.run_dir = run_dir
        self.scope = scope
        self._payload = payload

    @property
    def path(self) -> Path:
        return self.run_dir / MANIFEST_NAME

    @property
    def config(self) -> dict[str, Any]:
        """The run's config, or this handle's scope config when opened with a scope."""
        if self.scope is not None:
            return self._payload.get("scopes", {}).get(self.scope, {})
        return self._payload["config"]

    @property
    def provenance(self) -> dict[str, Any]:
        return self._payload["provenance"]

    @property
    def units(self) -> dict[str, dict[str, Any]]:
        """Recorded units: relative path → {"table", "sha256", "num_rows", "recorded_utc"}."""
        return self._payload["units"]

    @property
    def planned_units(self) -> list[str]:
        """The units the writer planned (:meth:`plan`); [] for a manifest written before plans were recorded."""
        return list(self._payload.get("planned", {}).get("units", []))

    @property
    def planned_checkpoints(self) -> dict[str, list[int]]:
        """The training checkpoints the writer planned: run folder (relative) → steps."""
        return {k: list(v) for k, v in self._payload.get("planned", {}).get("checkpoints", {}).items()}

    def plan(self, units: Collection[str], *, checkpoints: Mapping[str, Collection[int]] | None = None) -> None:
        """Record what this run will have when it is finished: ``units`` (relative unit paths) and ``checkpoints``
        (a training run folder, relative, or ``"."`` for this one → its scheduled steps). A later :meth:`plan`
        replaces the record (a study extended by more seeds plans more)."""
        planned = {
            "units": sorted({self._key(unit) for unit in units}),
            "checkpoints": {self._key(k): sorted({int(s) for s in v}) for k, v in (checkpoints or {}).items()},
        }
        with _locked(self.run_dir):
            payload = _load(self.path) or self._payload
            if payload.get("planned") != planned:
                payload["planned"] = planned
                _store(self.path, payload)
        self._payload = payload

    @classmethod
    def open(
        cls,
        run_dir: str | os.PathLike[str],
        *,
        config: Mapping[str, Any] | None = None,
        scope: str | None = None,
        growable: Collection[str] = (),
    ) -> Manifest:
        """Open the manifest of ``run_dir``, creating it (with ``config`` and provenance) if there is none.

        Reopening with a ``config`` that differs from the recorded one raises ConfigError: resuming must not
        mix results of two configurations in one run directory. The one exception are the list-valued keys named
        in ``growable`` (a study's seeds): a config that differs from the recorded one only there, and keeps
        every recorded item of those lists, extends the run and is recorded in its place, so the units done so
        far stay valid and the new items add theirs. A run directory opened first without a config takes the
        first config given. Producers that share a run directory with their own configs (e.g. one audit per
        checkpoint of a study) pass a ``scope`` (``"audit/step=000100"``): configs are then recorded and compared
        per scope, and :attr:`config` is that scope's config.
        """
        directory = Path(run_dir)
        wanted = _jsonable(dict(config or {}))
        with _locked(directory):
            payload = _load(directory / MANIFEST_NAME)
            changed_payload = payload is None
            if payload is None:
                payload = {"format": _FORMAT, "config": {}, "provenance": provenance(), "units": {}}
            configs = payload.setdefault("scopes", {}) if scope is not None else payload
            slot = scope if scope is not None else "config"
            recorded = configs.get(slot) or {}
            if config is not None and recorded and recorded != wanted:
                differ = sorted(k for k in set(wanted) | set(recorded) if wanted.get(k) != recorded.get(k))
                if not _extends(recorded, wanted, differ, growable):
                    raise ConfigError(_config_mismatch(directory, scope, recorded, differ, growable))
                configs[slot] = wanted
                changed_payload = True
            if config is not None and not recorded:
                configs[slot] = wanted
                changed_payload = True
            if changed_payload:
                _store(directory / MANIFEST_NAME, payload)
        return cls(directory, payload, scope=scope)

    @classmethod
    def load(cls, run_dir: str | os.PathLike[str]) -> Manifest:
        """Read an existing manifest; FileFormatError if the directory has none."""
        directory = Path(run_dir)
        payload = _load(directory / MANIFEST_NAME)
        if payload is None:
            raise FileFormatError(f"no {MANIFEST_NAME} in {str(directory)!r}; is this an attnsens run directory?")
        return cls(directory, payload)

    def refresh(self) -> None:
        """Re-read the manifest from disk (other processes may have recorded units)."""
        payload = _load(self.path)
        if payload is not None:
            self._payload = payload

    def is_done(self, unit: str | os.PathLike[str]) -> bool:
        """True iff ``unit`` (relative to the run dir) is recorded and its file exists with the recorded hash."""
        key = self._key(unit)
        entry = self.units.get(key)
        if entry is None:
            return False
        file = self.run_dir / key
        return file.is_file() and sha256_file(file) == entry["sha256"]

    def pending(self, units: list[str]) -> list[str]:
        """The subset of ``units`` (in order) that still has to be computed."""
        return [u for u in units if not self.is_done(u)]

    def record(self, unit: str | os.PathLike[str], *, table: str | None = None) -> None:
        """Record the finished file ``unit`` (relative to the run dir) with its sha256 and row count."""
        key = self._key(unit)
        file = self.run_dir / key
        if not file.is_file():
            raise FileFormatError(f"cannot record {key!r}: no such file in {str(self.run_dir)!r}; write it first")
        entry: dict[str, Any] = {
            "table": table,
            "sha256": sha256_file(file),
            "num_rows": pq.read_metadata(file).num_rows if file.suffix == ".parquet" else None,
            "recorded_utc": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        }
        with _locked(self.run_dir):
            payload = _load(self.path) or self._payload
            payload["units"][key] = entry
            _store(self.path, payload)
        self._payload = payload

    def forget(self, unit: str | os.PathLike[str]) -> None:
        """Unrecord ``unit`` (its results no longer hold), so that a rerun recomputes it; its file stays."""
        key = self._key(unit)
        with _locked(self.run_dir):
            payload = _load(self.path) or self._payload
            if payload["units"].pop(key, None) is not None:
                _store(self.path, payload)
        self._payload = payload

    def write_unit(
        self,
        unit: str | os.PathLike[str],
        data: pa.Table | pd.DataFrame | Mapping[str, Any],
        *,
        schema: str | TableSchema,
        metadata: Mapping[str, Any] | None = None,
    ) -> Path:
        """Write ``data`` as the Parquet unit file ``unit`` (atomically, run config in its metadata), then record it.

        A unit is its file and its manifest entry: when the entry cannot be recorded (a full disk that still took
        the file), the file is taken back out, and a file it replaced is put back, so the folder is as it was
        before the unit began.
        """
        with self.unit_parts(unit, schema=schema, metadata=metadata) as write:
            write(data)
        return self.run_dir / self._key(unit)

    @contextlib.contextmanager
    def unit_parts(
        self,
        unit: str | os.PathLike[str],
        *,
        schema: str | TableSchema,
        metadata: Mapping[str, Any] | None = None,
    ) -> Iterator[Callable[[pa.Table | pd.DataFrame | Mapping[str, Any]], None]]:
        """``write_unit`` for a unit produced in parts: yields ``write(part)``, each call one row group of the file.

        The unit is written and recorded when the block ends without an error, exactly as by ``write_unit``; on
        any error nothing of it reaches the folder or the manifest, and a file it was to replace stays.
        """
        target = self.run_dir / self._key(unit)
        config = {"config": self.config, **(metadata or {})}
        with _kept_aside(target) as previous:
            with parquet_parts(target, schema=schema, metadata=config) as write:
                yield write
            try:
                self.record(unit, table=schema if isinstance(schema, str) else schema.name)
            except Exception:
                if previous is not None:
                    os.replace(previous, target)
                else:
                    target.unlink(missing_ok=True)
                raise

    def verify(self) -> None:
        """Raise CheckpointError naming every recorded unit whose file is missing or whose hash changed."""
        bad = [key for key in self.units if not self.is_done(key)]
        if bad:
            raise CheckpointError(
                f"{len(bad)} recorded file(s) in {str(self.run_dir)!r} are missing or corrupted: {', '.join(bad[:5])}"
                f"{' …' if len(bad) > 5 else ''}; delete them and rerun to recompute"
            )

    def _key(self, unit: str | os.PathLike[str]) -> str:
        path = Path(unit)
        if path.is_absolute():
            try:
                path = path.relative_to(self.run_dir)
            except ValueError:
                raise FileFormatError(f"{str(unit)!r} is not inside the run directory {str(self.run_dir)!r}") from None
        if ".." in path.parts:
            raise FileFormatError(f"unit path {str(unit)!r} leaves the run directory; give a path inside it")
        return path.as_posix()


@contextlib.contextmanager
def _kept_aside(target: Path) -> Iterator[Path | None]:
    """A hard link ``.<name>.previous.<pid>.tmp`` to the file ``target`` holds now (None when there is none, or
    the file system has no hard links), removed at the end: what ``write_unit`` puts back if the unit fails. A
    link takes no space, so it works on a full disk; a killed writer's link is a temporary file that the next
    run removes."""
    link = target.with_name(f".{target.name}.previous.{os.getpid()}.tmp")
    previous: Path | None = link
    try:
        os.link(target, link)
    except OSError:
        previous = None
    try:
        yield previous
    finally:
        if previous is not None:
            previous.unlink(missing_ok=True)


def _jsonable(value: Any) -> Any:
    try:
        return json.loads(json.dumps(value, default=str, sort_keys=True))
    except (TypeError, ValueError) as err:
        raise ConfigError(f"config is not JSON-serialisable ({err}); pass plain values") from None


def _load(path: Path) -> dict[str, Any] | None:
    if not path.exists():
        return None
    try:
        payload = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise FileFormatError(f"cannot read {str(path)!r} ({err}); restore it or start a new run directory") from None
    if not isinstance(payload, dict) or payload.get("format") != _FORMAT or "units" not in payload:
        raise FileFormatError(f"{str(path)!r} is not an attnsens manifest (format {_FORMAT}); check the directory")
    problem = manifest_problem(payload)
    if problem is not None:
        raise FileFormatError(
            f"{str(path)!r} is malformed: {problem}; restore it, or move the run directory aside and rerun"
        )
    return payload


def manifest_problem(payload: dict[str, Any]) -> str | None:
    """What is wrong with a parsed run manifest (None when it fits the layout of the module docstring)."""
    for name in ("config", "provenance", "units"):
        if not isinstance(payload.get(name), dict):
            return f"{name!r} is {type(payload.get(name)).__name__}, not an object"
    if not isinstance(payload.get("scopes", {}), dict):
        return "'scopes' is not an object"
    for key, entry in payload["units"].items():
        if _outside(key):
            return f"unit {key!r} is not a relative path inside the run directory"
        if not isinstance(entry, dict):
            return f"unit {key!r} has a {type(entry).__name__} entry, not an object"
        if not isinstance(entry.get("sha256"), str) or not _SHA256.match(entry["sha256"]):
            return f"unit {key!r} has sha256 {entry.get('sha256')!r}, not 64 hex digits"
        if not isinstance(entry.get("table"), str | None):
            return f"unit {key!r} has table {entry.get('table')!r}, not a name"
        if entry.get("num_rows") is not None and type(entry["num_rows"]) is not int:
            return f"unit {key!r} has num_rows {entry['num_rows']!r}, not an integer"
    return _plan_problem(payload.get("planned", {}))


def _plan_problem(planned: Any) -> str | None:
    if not isinstance(planned, dict):
        return "'planned' is not an object"
    units, checkpoints = planned.get("units", []), planned.get("checkpoints", {})
    if not isinstance(units, list) or not isinstance(checkpoints, dict):
        return "'planned' does not hold a list of units and an object of checkpoints"
    for key in [*units, *(k for k in checkpoints if k != ".")]:  # "." : the run folder's own checkpoints
        if not isinstance(key, str) or _outside(key):
            return f"planned unit {key!r} is not a relative path inside the run directory"
    for key, steps in checkpoints.items():
        if not isinstance(steps, list) or any(type(step) is not int or step < 0 for step in steps):
            return f"planned checkpoints of {key!r} are not a list of steps"
    return None


def _outside(key: str) -> bool:
    """Whether ``key`` is not a relative path inside the run directory (absolute, ``..``, a drive, a backslash)."""
    parts = key.split("/")
    return key.startswith("/") or "\\" in key or ":" in parts[0] or any(p in ("", ".", "..") for p in parts)


def _store(path: Path, payload: dict[str, Any]) -> None:
    text = json.dumps(payload, indent=2, sort_keys=True, default=str) + "\n"
    atomic_write(path, lambda tmp: Path(tmp).write_text(text))


@contextlib.contextmanager
def _locked(run_dir: Path) -> Iterator[None]:
    """Exclusive advisory lock on ``run_dir/.manifest.lock`` (no-op where fcntl does not exist)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:
        yield
        return
    from attnsens.store.lock import refuse_other_kinds

    path = run_dir / ".manifest.lock"
    refuse_other_kinds(path)  # a directory or a link in its place is named; a link is never followed
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        descriptor = os.open(path, flags, 0o644)
    except OSError as err:
        refuse_other_kinds(path)
        raise FileFormatError(f"cannot open {path} ({err.strerror or err}); check the folder's permissions") from None
    with os.fdopen(descriptor, "a") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
