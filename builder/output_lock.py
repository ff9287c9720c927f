"""One conversion at a time into one `-o`: an flock on `.NAME.lock` beside the target (next to `.NAME.tmp-XXXX`).

The lock is taken before the temporary folder is made and held until the output is swapped in (or removed). A second
conversion into the same `-o` finds it held and fails in one line naming the process that holds it; the winner's
output is untouched and complete. The lock file holds the holder's pid and is deleted by the holder when it is done
(after checking, under the lock, that the name still points at the file it locked: a run that opened the old file
retries on the new one). The kernel drops the lock of a killed process, so a stale lock file never blocks.
"""
from __future__ import annotations

import fcntl
import os
from contextlib import contextmanager
from pathlib import Path

from .errors import ConversionError


def lock_path(target: Path) -> Path:
    return target.parent / f".{target.name}.lock"


@contextmanager
def output_lock(target: Path, shown: Path):
    """Hold the lock for `target` (the resolved -o) while the block runs; ConversionError naming `shown` (the
    user's -o) when another process holds it."""
    path = lock_path(target)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_pid(fd)
            os.close(fd)
            who = f"process {holder}" if holder else "another process"
            raise ConversionError(f"output is being written by {who} (another conversion into the same -o); wait "
                                  "for it to finish or choose another -o", file=shown) from None
        except BaseException:
            os.close(fd)
            raise
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # the holder we waited on deleted the file: lock the new one
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass
        os.close(fd)


def _read_pid(fd: int) -> int | None:
    try:
        return int(os.pread(fd, 32, 0).decode().strip() or 0) or None
    except (OSError, ValueError):
        return None
