"""Check a run folder against its manifest before anything reads it (``report``, ``query``, ``attnsens verify``).

Four kinds of problem are found, each named by its unit (the file's path relative to the run folder):

- ``missing``: recorded in the manifest, no file on disk;
- ``changed``: the file's sha256 differs from the recorded one (overwritten, flipped bytes, edited manifest);
- ``misplaced``: the file's ``step``/``seed`` (or ``batch`` for ``sequence=``) values disagree with the key in
  its path, e.g. step 4's rows copied over ``rows/seed=0/step=000008.parquet``;
- ``unreadable``: not a readable Parquet file (truncated, not Parquet); such a file is never handed to DuckDB;
- ``extra``: a Parquet file under the folder that the manifest does not record.

A folder without ``manifest.json`` (``attnsens bounds --out``, hand-made folders) has nothing to compare with:
only readability is checked, and the check says the folder is unverified.

The training checkpoints below the folder (a study's ``runs/…/checkpoints``, or a training run's own) are checked
against their checkpoint manifests the same way: each file missing or changed, a ``state.json`` naming another step
or seed (misplaced), a checkpoint manifest that does not parse (unreadable).

Verified is not complete: the units and checkpoints the writer planned (``Manifest.plan``) that are not recorded
are named as absent, and a writer that holds the folder now (``.writer.lock``) is named; both leave :attr:`ok` as it
is (what is there verifies) and make :attr:`RunCheck.complete` False. A planned unit whose file is on disk but not
recorded is absent, not extra: the writer's rerun computes and records it.

Hash cache rule: a file's sha256 is kept in ``.hash-cache.json`` in the run folder together with its size,
mtime, ctime and inode (``os.stat``). A file whose four values all equal the cached ones is taken to still have
the cached sha256 and is not read again; any other file is hashed. Every write of a file changes its ctime
(which no user tool can set back) and attnsens replaces files by rename (a new inode), so a cached hash is
stale only if the file system's clock or metadata are tampered with. ``verify_run(..., rehash=True)`` and
``attnsens verify --rehash`` ignore the cache. Readers write the cache atomically and without a lock; a folder
they cannot write to is simply hashed every time.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from attnsens.errors import OutputWriteError, RunIntegrityError
from attnsens.store.lock import live_writer
from attnsens.store.manifest import MANIFEST_NAME, Manifest, sha256_file
from attnsens.store.parquet import atomic_write

CACHE_NAME = ".hash-cache.json"
KINDS = ("missing", "changed", "misplaced", "unreadable", "extra")
# Path keys and the column that must hold the key's value in every record of the unit.
_KEYS = {"step": "step", "seed": "seed", "sequence": "batch"}
_KEY_PART = re.compile(r"^(step|seed|sequence)=(\d+)(?:\.parquet)?$")
_LISTED = 3


class IncompleteRunWarning(UserWarning):
    """A run was read before it was complete: planned units are absent or a writer still holds it."""


@dataclass(frozen=True)
class Problem:
    """One unit that cannot be trusted: its path (relative to the run folder), the kind and what was seen."""

    unit: str
    kind: str
    detail: str = ""

    def describe(self) -> str:
        return f"{self.unit} ({self.detail})" if self.detail else self.unit

    @property
    def checkpoint(self) -> str | None:
        """The checkpoint directory (relative) this problem is in, or None for a unit of the run."""
        parts = self.unit.split("/")
        if "checkpoints" not in parts:
            return None
        index = parts.index("checkpoints")
        return "/".join(parts[: index + 2]) if len(parts) > index + 2 else "/".join(parts[: index + 1])


@dataclass(frozen=True)
class RunCheck:
    """The result of :func:`verify_run`."""

    run_dir: Path
    has_manifest: bool
    verified: int
    problems: tuple[Problem, ...] = ()
    rebuild: str = field(default="", compare=False)
    checkpoints: int = 0
    absent: tuple[str, ...] = ()
    writer: str | None = None

    @property
    def ok(self) -> bool:
        """Every unit and checkpoint that is there verifies (:attr:`complete` says whether all planned ones are)."""
        return not self.problems

    @property
    def complete(self) -> bool:
        """Every planned unit and checkpoint is recorded, and no writer holds the folder."""
        return not self.absent and self.writer is None

    def incompleteness(self) -> str:
        """One line naming the planned units that are absent and a live writer, with what to do ("" if complete)."""
        if self.complete:
            return ""
        parts = []
        if self.absent:
            named = ", ".join(self.absent[:_LISTED]) + (" …" if len(self.absent) > _LISTED else "")
            parts.append(f"{len(self.absent)} planned unit(s) absent ({named})")
        if self.writer is not None:
            parts.append(self.writer)
        if self.writer is not None:
            fix = "its results are provisional until the writer finishes"
        else:
            fix = f"finish it with {self.rebuild or 'the command that wrote it'}"
        return f"run folder {str(self.run_dir)!r} is not complete: {'; '.join(parts)}; {fix}"

    @property
    def unreadable(self) -> frozenset[Path]:
        """Files that must not be read (they would fail inside DuckDB)."""
        return frozenset(self.run_dir / p.unit for p in self.problems if p.kind == "unreadable")

    def by_kind(self) -> dict[str, list[Problem]]:
        found: dict[str, list[Problem]] = {}
        for problem in self.problems:
            found.setdefault(problem.kind, []).append(problem)
        return {kind: found[kind] for kind in KINDS if kind in found}

    def problem_list(self) -> str:
        """``1 missing (a), 2 changed (b: ..., c)`` with at most three units named per kind."""
        parts = []
        for kind, problems in self.by_kind().items():
            named = ", ".join(p.describe() for p in problems[:_LISTED]) + (" …" if len(problems) > _LISTED else "")
            parts.append(f"{len(problems)} {kind} ({named})")
        return ", ".join(parts)

    def message(self) -> str:
        """One line: what is wrong and the fix, which rebuilds (rerun the writing command, after deleting a damaged
        checkpoint that it would otherwise refuse) and never deletes a result that holds; or read with --force."""
        fixes = []
        units = [p for p in self.problems if p.checkpoint is None]
        checkpoints = sorted({p.checkpoint for p in self.problems if p.checkpoint is not None})
        rebuild = self.rebuild or "the command that wrote it"
        if checkpoints:
            fixes.append(
                f"delete the damaged checkpoint folder(s) {', '.join(checkpoints)} and rerun {rebuild}: training "
                "resumes from the last good checkpoint (from the start if none is left) and rebuilds the rest"
            )
        if units and not self.has_manifest:
            fixes.append("rewrite or remove the bad files")
        elif units:
            fixes.append(
                f"rebuild with {rebuild}"
                + (
                    " (it recomputes and records the extra units; a file that is no unit of this run stays extra: "
                    "move it out of the folder)"
                    if any(p.kind == "extra" for p in units)
                    else ""
                )
            )
        where = "does not match its manifest" if self.has_manifest else "holds unreadable files"
        return (
            f"run folder {str(self.run_dir)!r} {where}: {self.problem_list()}; "
            f"{' or '.join(fixes)}, or pass --force to read it anyway"
        )

    def raise_if_bad(self) -> None:
        if not self.ok:
            raise RunIntegrityError(self.message())

    def summary(self) -> str:
        """One line for a clean folder."""
        checkpoints = f", {self.checkpoints} checkpoint(s) match their manifests" if self.checkpoints else ""
        if not self.has_manifest:
            return f"{str(self.run_dir)!r} has no {MANIFEST_NAME}: its files are readable but not verified{checkpoints}"
        return f"{str(self.run_dir)!r}: {self.verified} unit(s) match {MANIFEST_NAME}{checkpoints}"


def runs_below(root: Path) -> list[Path]:
    """The run folders inside ``root`` (any depth, hidden folders skipped): those holding a run manifest (a JSON
    object with ``format`` and ``units``; a training run's ``checkpoints/manifest.json`` is no such manifest)."""
    import json

    found = []
    for path in sorted(root.rglob(MANIFEST_NAME)):
        if path.parent == root or any(part.startswith(".") for part in path.relative_to(root).parts):
            continue
        try:
            payload = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(payload, dict) and "format" in payload and "units" in payload:
            found.append(path.parent)
    return found


def verify_run(run_dir: str | os.PathLike[str], *, rehash: bool = False) -> RunCheck:
    """Check every unit of ``run_dir`` against its manifest (module docstring); never raises for bad units.

    Raises FileFormatError when the folder does not exist or its manifest is malformed.
    """
    from attnsens.errors import FileFormatError

    root = Path(run_dir)
    if not root.is_dir():
        raise FileFormatError(f"run directory {str(root)!r} does not exist; pass the --out directory of a run")
    on_disk = _parquet_units(root)
    if not (root / MANIFEST_NAME).exists():
        runs = runs_below(root)
        if runs:
            listed = ", ".join(str(run.relative_to(root)) for run in runs[:4]) + (", …" if len(runs) > 4 else "")
            raise FileFormatError(
                f"{str(root)!r} is no run (it has no {MANIFEST_NAME}) but holds {len(runs)} run folder(s): {listed}; "
                "pass one of them (their tables are not pooled unchecked)"
            )
        cache = _HashCache(root, enabled=not rehash)
        unreadable = [_unreadable(unit) for unit in on_disk if not _readable(root / unit)]
        checked, checkpoint_problems, _ = _check_checkpoints(root, cache, {})
        cache.save()
        return RunCheck(
            root, has_manifest=False, verified=0, problems=(*unreadable, *checkpoint_problems), checkpoints=checked,
            writer=live_writer(root),
        )  # fmt: skip
    manifest = Manifest.load(root)
    cache = _HashCache(root, enabled=not rehash)
    problems: list[Problem] = []
    planned = set(manifest.planned_units)
    for unit, entry in sorted(manifest.units.items()):
        file = root / unit
        if not file.is_file():
            problems.append(Problem(unit, "missing"))
            continue
        if file.suffix != ".parquet":
            if cache.sha256(file, unit) != entry["sha256"]:
                problems.append(Problem(unit, "changed", "sha256 differs from the manifest"))
            continue
        if not _readable(file):
            problems.append(_unreadable(unit))
            continue
        if wrong := _key_mismatch(file, unit):
            problems.append(Problem(unit, "misplaced", wrong))
        elif cache.sha256(file, unit) != entry["sha256"]:
            problems.append(Problem(unit, "changed", "sha256 differs from the manifest"))
    for unit in on_disk:
        if unit not in manifest.units and unit not in planned:
            readable = _readable(root / unit)
            problems.append(Problem(unit, "extra", "not in the manifest") if readable else _unreadable(unit))
    verified = len(manifest.units) - sum(1 for p in problems if p.kind != "extra")
    checked, checkpoint_problems, absent_checkpoints = _check_checkpoints(root, cache, manifest.planned_checkpoints)
    cache.save()
    absent = sorted(planned - set(manifest.units)) + absent_checkpoints
    return RunCheck(
        root, has_manifest=True, verified=verified, problems=(*problems, *checkpoint_problems),
        rebuild=_rebuild(manifest), checkpoints=checked, absent=tuple(absent), writer=live_writer(root),
    )  # fmt: skip


def _check_checkpoints(
    root: Path, cache: _HashCache, planned: dict[str, list[int]]
) -> tuple[int, list[Problem], list[str]]:
    """The training checkpoints below ``root`` against their checkpoint manifests: (checkpoints that verify, the
    problems, the planned checkpoints that are not registered)."""
    from attnsens.errors import CheckpointError
    from attnsens.store.checkpoint_files import MANIFEST, checkpoint_name, read_manifest, recorded_key

    found = sorted({p.parent.parent for p in root.glob("**/checkpoints/" + MANIFEST) if p.is_file()})
    folders = {("." if d == root else d.relative_to(root).as_posix()): d for d in found}
    folders.update({name: root / name for name in planned if name not in folders})
    problems: list[Problem] = []
    absent: list[str] = []
    checked = 0
    for name, folder in sorted(folders.items()):
        prefix = "" if name == "." else f"{name}/"
        if any(part.startswith(".") for part in Path(prefix).parts):
            continue
        try:
            entries = read_manifest(folder)
        except CheckpointError as err:
            problems.append(Problem(f"{prefix}checkpoints/{MANIFEST}", "unreadable", str(err).split(";")[0]))
            continue
        seed = _seed_of(name)
        for entry_name, entry in sorted(entries.items()):
            before = len(problems)
            directory = f"{prefix}checkpoints/{entry_name}"
            for file_name, expected in sorted(entry["files"].items()):
                path = folder / "checkpoints" / entry_name / file_name
                if not path.is_file():
                    problems.append(Problem(f"{directory}/{file_name}", "missing"))
                elif cache.sha256(path, f"{directory}/{file_name}") != expected:
                    problems.append(Problem(f"{directory}/{file_name}", "changed", "sha256 differs from the manifest"))
            if len(problems) == before:
                try:
                    step, recorded_seed = recorded_key(folder / "checkpoints" / entry_name)
                except CheckpointError:
                    step, recorded_seed = None, None
                wrong = [f"step {step!r}"] if step != entry["step"] else []
                wrong += [f"seed {recorded_seed!r}"] if seed is not None and recorded_seed != seed else []
                if wrong:
                    problems.append(
                        Problem(f"{directory}/state.json", "misplaced", f"holds {' and '.join(wrong)}, its place says "
                                f"step {entry['step']}" + ("" if seed is None else f" of seed {seed}"))
                    )  # fmt: skip
                else:
                    checked += 1
        registered = {entry["step"] for entry in entries.values()}
        absent += [f"{prefix}checkpoints/{checkpoint_name(s)}" for s in planned.get(name, []) if s not in registered]
    return checked, problems, absent


def _seed_of(folder: str) -> int | None:
    """The training seed a study's run folder is named by (``…/seed=3``), or None."""
    match = re.fullmatch(r"seed=(\d+)", folder.rsplit("/", 1)[-1])
    return int(match.group(1)) if match else None


def forget_untrusted(manifest: Manifest, *, note: Callable[[str], None] | None = None) -> list[Problem]:
    """Unrecord the units of ``manifest`` that verify as misplaced or unreadable, so that the writer rebuilds them;
    return their problems (each also passed to ``note``).

    :meth:`Manifest.is_done` trusts the recorded sha256 alone, and a unit moved into another unit's place whose
    recorded hash was edited to match would otherwise be kept by every rerun that the verification error advises.
    Missing and changed units need nothing: their hash check already fails.
    """
    check = verify_run(manifest.run_dir)
    untrusted = [p for p in check.problems if p.kind in ("misplaced", "unreadable") and p.unit in manifest.units]
    for problem in untrusted:
        manifest.forget(problem.unit)
        if note is not None:
            note(f"rebuilding {problem.describe()}: its contents do not match its place")
    return untrusted


def _parquet_units(root: Path) -> list[str]:
    units = []
    for path in sorted(root.rglob("*.parquet")):
        parts = path.relative_to(root).parts
        if not any(part.startswith(".") for part in parts) and path.is_file():
            units.append("/".join(parts))
    return units


def _readable(file: Path) -> bool:
    """Whether the file has a Parquet footer that parses (a truncated file has none)."""
    try:
        pq.read_metadata(file)
    except (OSError, pa.ArrowException):
        return False
    return True


def _unreadable(unit: str) -> Problem:
    table = unit.split("/", 1)[0] if "/" in unit else Path(unit).stem
    return Problem(unit, "unreadable", f"cannot read table {table!r}: truncated or not Parquet")


def _key_mismatch(file: Path, unit: str) -> str | None:
    """``holds step 4, …`` when the unit's records disagree with a ``step=``/``seed=``/``sequence=`` part of its
    path. Row-group statistics (min = max = the key) settle it without reading data; otherwise the key columns
    are read."""
    wanted = {}
    for part in unit.split("/"):
        if match := _KEY_PART.match(part):
            wanted[_KEYS[match.group(1)]] = int(match.group(2))
    metadata = pq.read_metadata(file)
    names = [metadata.schema.column(i).path for i in range(metadata.num_columns)]  # leaf columns, by path
    columns = [c for c in wanted if c in names]
    unsettled = [c for c in columns if not _statistics_show(metadata, names.index(c), wanted[c])]
    if not unsettled:
        return None
    try:
        table = pq.read_table(file, columns=unsettled)
    except (OSError, pa.ArrowException) as err:
        return f"cannot read its {', '.join(unsettled)} columns ({' '.join(str(err).split())[:60]})"
    for column in unsettled:
        values = sorted(set(table.column(column).to_pylist()) - {None})
        if values and values != [wanted[column]]:
            shown = ", ".join(str(v) for v in values[:3]) + (" …" if len(values) > 3 else "")
            return f"holds {column} {shown}, its path says {wanted[column]}"
    return None


def _statistics_show(metadata: pq.FileMetaData, index: int, value: int) -> bool:
    """True iff every row group's statistics prove that column ``index`` holds only ``value``."""
    for group in range(metadata.num_row_groups):
        stats = metadata.row_group(group).column(index).statistics
        if stats is None or not stats.has_min_max or stats.min != value or stats.max != value:
            return False
    return True


def _rebuild(manifest: Manifest) -> str:
    """The command that wrote the folder, from the manifest's provenance, with ``--out`` naming this folder (it
    may have been moved or copied since), or a description of it when another program wrote it."""
    argv = [str(a) for a in manifest.provenance.get("argv") or []]
    folder = str(manifest.run_dir)
    if len(argv) < 2 or not _is_attnsens(argv[0]):
        return f"the command that wrote it (attnsens study/audit … --out {shlex.quote(folder)})"
    arguments, found = [], False
    for index, argument in enumerate(argv[1:], start=1):
        if argv[index - 1] == "--out":
            argument, found = folder, True
        elif argument.startswith("--out="):
            argument, found = f"--out={folder}", True
        arguments.append(argument)
    if not found:  # ``attnsens audit`` without --out chose a new folder under runs/
        arguments += ["--out", folder]
    if arguments[0] == "train" and "--resume" not in arguments:  # without it, train refuses a folder with checkpoints
        arguments.append("--resume")
    return f"`{shlex.join(['attnsens', *arguments])}`"


def _is_attnsens(program: str) -> bool:
    """The console script ``attnsens`` or ``python -m attnsens`` (argv[0] is then the package's __main__.py)."""
    path = Path(program)
    return path.name == "attnsens" or (path.name == "__main__.py" and path.parent.name == "attnsens")


class _HashCache:
    """sha256 by (size, mtime, ctime, inode), persisted in the run folder (rule in the module docstring)."""

    def __init__(self, root: Path, *, enabled: bool) -> None:
        self.path, self.enabled, self.changed = root / CACHE_NAME, enabled, False
        self.entries: dict[str, Any] = {}
        if enabled:
            with contextlib.suppress(OSError, ValueError):
                loaded = json.loads(self.path.read_text())
                if isinstance(loaded, dict):
                    self.entries = loaded

    def sha256(self, file: Path, unit: str) -> str:
        info = file.stat()
        stamp = [info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino]
        entry = self.entries.get(unit)
        if self.enabled and isinstance(entry, dict) and entry.get("stat") == stamp and "sha256" in entry:
            return str(entry["sha256"])
        digest = sha256_file(file)
        self.entries[unit] = {"stat": stamp, "sha256": digest}
        self.changed = True
        return digest

    def save(self) -> None:
        if not self.changed:
            return
        text = json.dumps(self.entries, sort_keys=True)
        with contextlib.suppress(OSError, OutputWriteError):
            atomic_write(self.path, lambda tmp: Path(tmp).write_text(text))
