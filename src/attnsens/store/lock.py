"""One writer per run folder: ``train``, ``study`` and ``audit`` hold an exclusive lock on their ``--out``.

The lock is ``RUN/.writer.lock``: an advisory ``flock`` held for the whole command, and the holder's pid, host,
command and start time written into the file so that a refused writer can name it. The operating system drops
a flock when its process dies, however it dies, so a lock left by a killed process (a file naming a pid, no
flock) is taken over at once, with a note naming the holder and only what is known of it: on this host, whether
its pid still runs; on another host, its record and age alone. Something other than a regular file where the lock
file goes (a directory, a link) is refused, never followed. Readers (``report``, ``query``, ``verify``)
never take the lock: they only read files that writers replace atomically.

Taking the lock also removes what killed writers left behind: temporary files and staging directories named
``.<name>.tmp`` or ``.<name>.<pid>.tmp`` anywhere in the folder, except those of a process that is still running
(e.g. a report being written next to the run). A folder that the lock itself created and that holds only the lock
file when the command ends (its input was refused before anything was written) is removed again.

Commands take the lock before their expensive work (``audit`` before the model loads, ``train`` and ``study``
before the corpus is read), so a second writer is refused at once.

Under torchrun only rank 0 takes the lock; the other ranks of the same job write through it. Without ``fcntl``
(Windows) the pid in the file is the lock: a live pid on this host refuses, any other is taken over.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import functools
import inspect
import json
import os
import re
import shutil
import socket
import stat
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from attnsens._ranks import first_rank
from attnsens.errors import FileFormatError, RunLockedError

LOCK_NAME = ".writer.lock"
_TEMPORARY = re.compile(r"^\..+?(?:\.(\d+))?\.tmp$")
_HELD: set[Path] = set()

F = TypeVar("F", bound=Callable[..., Any])


def _note(message: str) -> None:
    sys.stderr.write(f"note: {message}\n")


@contextlib.contextmanager
def writer_lock(
    run_dir: str | os.PathLike[str], *, command: str, note: Callable[[str], None] = _note
) -> Iterator[Path]:
    """Hold the exclusive writer lock of ``run_dir`` (created if needed) for the ``with`` block.

    Raises RunLockedError naming the holder when another live process holds it. Re-entrant within a process.
    A folder that the lock created and that holds nothing but the lock file at the end (the command failed
    before writing anything) is removed again, so that a refused input leaves no empty run folder behind.
    """
    directory = Path(run_dir).resolve()
    if directory in _HELD:
        yield directory
        return
    created = [folder for folder in (directory, *directory.parents) if not folder.exists()]
    handle = None
    try:
        handle = _open_locked(directory)
        _take(handle, directory, command, note)
        remove_leftovers(directory)
        _HELD.add(directory)
        try:
            yield directory
        finally:
            _HELD.discard(directory)
            os.ftruncate(handle.fileno(), 0)
    finally:
        if handle is not None:
            if created and directory.is_dir() and [p.name for p in directory.iterdir()] == [LOCK_NAME]:
                (directory / LOCK_NAME).unlink()  # still under the flock: a waiting writer reopens (_open_locked)
            handle.close()
        _remove_empty(created)


def _take(handle: Any, directory: Path, command: str, note: Callable[[str], None]) -> None:
    """Write this process's record into the flocked lock file, after a note on the dead holder it replaces.

    A full disk refuses even these few bytes: that is one line naming the folder, before any work is done.
    """
    from attnsens.store.parquet import output_write_error

    previous = _parse(handle.read())
    if previous and previous.get("pid") != os.getpid():
        note(f"took over the lock of {directory}: {_takeover(previous)}")
    record = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "command": command,
        "started_utc": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
    }
    try:  # unbuffered, so that nothing is left in a buffer for close() to fail on again
        os.ftruncate(handle.fileno(), 0)
        os.write(handle.fileno(), (json.dumps(record) + "\n").encode())  # append mode: at 0 once truncated
    except OSError as err:
        raise output_write_error(directory / LOCK_NAME, err) from None


def _open_locked(directory: Path) -> Any:
    """The lock file of ``directory``, open and flocked (positioned at its start); RunLockedError when held.

    A lock file that was unlinked between our open and our flock (its folder was being cleaned up by the holder
    that just finished) is no lock at all: open the current one again.
    """
    from attnsens.store.parquet import output_write_error

    path = directory / LOCK_NAME
    while True:
        try:
            directory.mkdir(parents=True, exist_ok=True)
            refuse_other_kinds(path)
            # O_NOFOLLOW: a link put in place of the lock file never makes attnsens write where it points.
            flags = os.O_RDWR | os.O_CREAT | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
            handle = os.fdopen(os.open(path, flags, 0o644), "a+")
        except OSError as err:
            refuse_other_kinds(path)  # replaced between the check and the open
            raise output_write_error(path, err) from None
        try:
            _acquire(handle, directory)
            if _same_file(handle, path):
                handle.seek(0)
                return handle
        except BaseException:
            handle.close()
            raise
        handle.close()


def refuse_other_kinds(path: Path) -> None:
    """RunLockedError naming ``path`` when something other than a regular file (a directory, a link, a pipe) sits
    where the lock file goes: attnsens neither writes into it nor follows it, nor removes what it did not write."""
    try:
        status = os.lstat(path)
    except OSError:
        return
    if stat.S_ISREG(status.st_mode):
        return
    kind = (
        "a directory"
        if stat.S_ISDIR(status.st_mode)
        else "a symbolic link"
        if stat.S_ISLNK(status.st_mode)
        else "not a regular file"
    )
    raise FileFormatError(
        f"{path} is {kind}, where attnsens keeps a lock file of {path.parent}; it was not written by "
        f"attnsens: move it out of the folder, then rerun the same command (or choose another --out)"
    )


def _same_file(handle: Any, path: Path) -> bool:
    try:
        return os.path.samestat(os.fstat(handle.fileno()), os.stat(path))
    except FileNotFoundError:
        return False


def _remove_empty(folders: list[Path]) -> None:
    """Remove ``folders`` (innermost first) while they are empty; stop at the first that is not."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            return


@contextlib.contextmanager
def writing_run_folder(folder: str | os.PathLike[str] | None, command: str) -> Iterator[None]:
    """:func:`writer_lock` on ``folder`` for the process that writes it: nothing for None, nor for the ranks
    other than 0 under torchrun (they write through rank 0's lock)."""
    if folder is None or not first_rank():
        yield
        return
    with writer_lock(folder, command=command):
        yield


def writes_run_folder(parameter: str, command: str) -> Callable[[F], F]:
    """Decorator: the call holds :func:`writing_run_folder` on its ``parameter`` argument."""

    def decorate(func: F) -> F:
        signature = inspect.signature(func)

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with writing_run_folder(signature.bind(*args, **kwargs).arguments.get(parameter), command):
                return func(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return decorate


def remove_leftovers(run_dir: Path) -> list[Path]:
    """Remove the temporary files and staging directories of dead writers below ``run_dir``; return them."""
    removed = []
    for path in sorted(run_dir.rglob(".*.tmp"), key=lambda p: len(p.parts), reverse=True):
        match = _TEMPORARY.match(path.name)
        if match is None:
            continue
        if match.group(1) is not None and _alive(int(match.group(1))):
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        removed.append(path)
    return removed


def read_holder(run_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The record in ``run_dir``'s lock file (None when there is none or it is empty)."""
    try:
        return _parse((Path(run_dir) / LOCK_NAME).read_text())
    except OSError:
        return None


def live_writer(run_dir: str | os.PathLike[str]) -> str | None:
    """Who is writing ``run_dir`` now, as far as a reader can tell without taking the lock; None when no one is.

    The lock file's record is emptied when its writer ends normally. A record naming a pid of this host that still
    runs is a live writer; one naming a dead pid was left by a killed writer (no one writes). Of a record naming
    another host nothing more can be known, and it is reported as such.
    """
    path = Path(run_dir) / LOCK_NAME
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return None
    except OSError:
        return None
    record = read_holder(run_dir)
    if not record:
        return None
    pid = record.get("pid")
    if pid == os.getpid() and record.get("host") == socket.gethostname():
        return None  # this process writes it, and reads it back at its end (a study's report)
    if record.get("host") == socket.gethostname():
        return f"{_describe(record)} is writing it" if isinstance(pid, int) and _alive(pid) else None
    return f"its lock file names {_describe(record)}, which may still be writing it (attnsens cannot tell)"


def _acquire(handle: Any, directory: Path) -> None:
    """Take the lock on the open lock file or raise RunLockedError naming the holder."""
    handle.seek(0)
    try:
        import fcntl
    except ImportError:
        previous = _parse(handle.read())
        if previous and previous.get("host") == socket.gethostname() and _alive(int(previous.get("pid", -1))):
            raise RunLockedError(_refusal(directory, previous)) from None
        return
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise RunLockedError(_refusal(directory, _parse(handle.read()))) from None


def _refusal(directory: Path, holder: dict[str, Any] | None) -> str:
    who = _describe(holder) if holder else "another process"
    return f"{directory} is being written by {who}; wait for it to finish or choose another --out directory"


def _takeover(record: dict[str, Any]) -> str:
    """What is known of the holder named in a lock file that no process holds: its pid is checked on this host
    only; of a process on another host attnsens knows only the record and its age."""
    age = _age(record.get("started_utc"))
    since = f", {age} ago" if age else ""
    described = _describe(record)[:-1] + since + ")"
    pid = record.get("pid")
    if record.get("host") == socket.gethostname() and isinstance(pid, int):
        if not _alive(pid):
            return f"{described} is no longer running"
        return f"{described} no longer holds it (that pid is now another process's)"
    return (
        f"the file names {described}, which holds no lock on it from here; attnsens cannot see the processes "
        f"of host {record.get('host')}: if that one still runs, stop it, as two writers would mix their results"
    )


def _age(started: Any) -> str | None:
    """``started`` (an ISO time in UTC) as the time since then: "40 s", "3 min", "5 h", "2 d"; None if unreadable.

    >>> _age((_dt.datetime.now(_dt.UTC) - _dt.timedelta(hours=5, minutes=1)).isoformat())
    '5 h'
    """
    try:
        seconds = (_dt.datetime.now(_dt.UTC) - _dt.datetime.fromisoformat(str(started))).total_seconds()
    except (TypeError, ValueError):
        return None
    if seconds < 0:
        return None
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{int(seconds // size)} {unit}"
    return f"{int(seconds)} s"


def _describe(record: dict[str, Any]) -> str:
    return (
        f"pid {record.get('pid')} on host {record.get('host')} "
        f"(attnsens {record.get('command')}, started {record.get('started_utc')})"
    )


def _parse(text: str) -> dict[str, Any] | None:
    try:
        record = json.loads(text)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return False
    return True
