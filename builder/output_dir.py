"""The output folder: which `-o` is refused, the temporary folder, the atomic swap, signals.

Rules (checked before anything is read or written):
  - `-o` may not be the input folder, inside it, or contain it (compared after resolving symlinks), nor `/`, nor the
    current folder or one of its parents (the folder is replaced as a whole).
  - An existing `-o` must be an empty folder or a previous output of this builder (it holds MARKER, written into
    every output); anything else is refused unless `--overwrite` is given, and a folder with sub-folders (a home
    or project folder typed by mistake; our outputs are flat) is refused even then.
  - A symlink `-o` is followed: the folder it points to is what gets replaced or created (the symlink itself is
    kept, and the temporary folder is made beside the target, on its file system); a dangling symlink is refused
    when the folder its target would be in does not exist.
Output is written to `.NAME.tmp-XXXX` beside the target and swapped in with one renameat2(RENAME_EXCHANGE) (two
renames where the kernel lacks it), then the old tree is deleted. SIGINT, SIGTERM and SIGHUP delete the temporary
folder before exiting; the swap and the clean-up run with those signals blocked, so no `.old` or `.tmp` folder is
left behind by a signal. A run killed outright (SIGKILL, the OOM killer) leaves its temporary folder; the next
conversion into the same target deletes it (the folder names its process, which must be gone). Deleting never
follows a symlink (shutil.rmtree does not).
"""
from __future__ import annotations

import ctypes
import errno
import glob
import json
import os
import shutil
import signal
import socket
import tempfile
import threading
from contextlib import contextmanager
from pathlib import Path

from .errors import ConversionError, Interrupted

MARKER = ".quark_onnx_builder.json"
OWNER_FILE = ".quark_onnx_builder.owner"  # in a temporary folder only: {"pid", "host"} of the converting process
SIGNALS = tuple(s for s in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None)) if s is not None)


def resolve_output(source: Path, output: Path, overwrite: bool = False) -> Path:
    """The folder that will be replaced (symlinks followed), or ConversionError if `-o` is refused."""
    shown = output
    target = Path(os.path.realpath(output))
    check_name_length(target, shown)
    if output.is_symlink() and not output.exists() and not target.parent.is_dir():
        raise ConversionError("output is a dangling symlink into a folder that does not exist", file=shown)
    src = Path(os.path.realpath(source))
    if target.parent == target:
        raise ConversionError("output folder cannot be the root folder", file=shown)
    if target == src:
        raise ConversionError("output folder is the input folder; it would replace the input", file=shown)
    if src in target.parents:
        raise ConversionError("output folder is inside the input folder", file=shown)
    if target in src.parents:
        raise ConversionError("output folder contains the input folder; it would replace the input", file=shown)
    cwd = Path(os.path.realpath(os.getcwd()))
    if target == cwd or target in cwd.parents:
        raise ConversionError("output folder is the current folder or contains it; the output folder is replaced "
                              "as a whole, choose a new folder", file=shown)
    if os.path.lexists(target):
        if not target.is_dir():
            raise ConversionError("output path exists and is not a folder", file=shown)
        try:
            entries = os.listdir(target)
        except OSError as exc:
            raise ConversionError(f"output folder unreadable ({exc.strerror})", file=shown) from None
        if entries and MARKER not in entries:
            if not overwrite:
                raise ConversionError("output folder exists and holds files this builder did not write (e.g. "
                                      f"{sorted(entries)[0]}); choose another -o, or pass --overwrite to replace "
                                      "it", file=shown)
            folders = sorted(e for e in entries if (target / e).is_dir() and not (target / e).is_symlink())
            if folders:  # a home or project folder typed by mistake: our outputs never hold sub-folders
                raise ConversionError(f"output folder holds sub-folders (e.g. {folders[0]}), which no output of "
                                      "this builder has; not replaced even with --overwrite, delete it yourself",
                                      file=shown)
    return target


TEMP_NAME_EXTRA = len("..tmp-") + 8  # `.NAME.tmp-XXXXXXXX` (tempfile.mkdtemp's 8 random characters)


def check_name_length(target: Path, shown: Path) -> None:
    """Refuse an -o whose name (or whose temporary folder's name) the file system cannot hold, before any work."""
    existing = target.parent
    while not os.path.isdir(existing) and existing.parent != existing:
        existing = existing.parent
    try:
        name_max = os.pathconf(existing, "PC_NAME_MAX")
    except (OSError, ValueError):
        name_max = 255
    longest = max((len(os.fsencode(part)) for part in target.parts), default=0)
    if longest > name_max or len(os.fsencode(target.name)) + TEMP_NAME_EXTRA > name_max:
        raise ConversionError(f"a name in the output path is too long for the file system ({name_max} bytes per "
                              f"name; the output folder's name may have at most {name_max - TEMP_NAME_EXTRA}, room "
                              "for the temporary folder beside it); choose a shorter -o", file=shown)


def write_marker(folder: Path, info: dict) -> None:
    (folder / MARKER).write_text(json.dumps({"written_by": "quark-onnx-builder", **info}, sort_keys=True) + "\n")


def make_temp(target: Path, warn=None) -> Path:
    """A fresh `.NAME.tmp-XXXX` beside the target, holding OWNER_FILE (this process) until it is swapped in.
    Temporary folders of killed runs (SIGKILL, OOM killer) of the same target are deleted first."""
    target.parent.mkdir(parents=True, exist_ok=True)
    for stale in remove_stale_temps(target):
        if warn:
            warn(f"deleted {stale}, left by an earlier conversion that was killed")
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    umask = os.umask(0)
    os.umask(umask)
    tmp.chmod(0o777 & ~umask)  # mkdtemp makes 0700; the output folder should get the usual permissions
    (tmp / OWNER_FILE).write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname()}))
    return tmp


def remove_stale_temps(target: Path) -> list[Path]:
    """Our temporary folders beside `target` whose owning process (same host) no longer exists."""
    removed = []
    for tmp in sorted(target.parent.glob(f".{glob.escape(target.name)}.tmp-*")):
        try:
            if tmp.is_symlink() or not tmp.is_dir():
                continue
            owner = json.loads((tmp / OWNER_FILE).read_text())
            pid, host = int(owner["pid"]), owner["host"]
        except (OSError, ValueError, KeyError, TypeError):
            continue  # not ours, or being written: never touched
        if host != socket.gethostname() or _alive(pid):
            continue
        remove_tree(tmp)
        removed.append(tmp)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: exists, someone else's
        return True
    return True


def remove_tree(path: Path) -> None:
    """Delete our temporary/old tree with the interrupting signals blocked (so it is not left half-deleted)."""
    with signals_blocked():
        shutil.rmtree(path, ignore_errors=True)


def swap_into_place(tmp: Path, target: Path) -> None:
    """Make `tmp` appear at `target` atomically; the previous `target` tree (if any) is deleted afterwards."""
    with signals_blocked():
        (tmp / OWNER_FILE).unlink(missing_ok=True)
        if not os.path.lexists(target):
            os.rename(tmp, target)
            return
        if _exchange(tmp, target):
            shutil.rmtree(tmp, ignore_errors=True)  # tmp now holds the previous output
            return
        old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
        os.rename(target, old / "tree")
        try:
            os.rename(tmp, target)
        except BaseException:
            os.rename(old / "tree", target)
            raise
        finally:
            shutil.rmtree(old, ignore_errors=True)


def _exchange(a: Path, b: Path) -> bool:
    """renameat2(a, b, RENAME_EXCHANGE): swap two paths in one step. False where unavailable."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


@contextmanager
def signals_blocked():
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "pthread_sigmask"):
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


@contextmanager
def signals_raise():
    """SIGTERM and SIGHUP raise Interrupted (SIGINT raises KeyboardInterrupt as usual) while the block runs, so the
    caller's clean-up runs for them too. Signals the process was started with ignored stay ignored."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, _frame):
        raise Interrupted(signum)

    previous = {}
    for sig in SIGNALS:
        # SIGINT raises KeyboardInterrupt already; an ignored signal stays ignored (`nohup` ignores SIGHUP so that
        # the conversion survives the terminal closing)
        if sig == signal.SIGINT or signal.getsignal(sig) == signal.SIG_IGN:
            continue
        previous[sig] = signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def write_error(exc: OSError, target: Path) -> ConversionError:
    """An OSError raised while writing the output, as one line naming the user's -o (never our temporary folder
    beside it: that name means nothing to the user and is deleted by the time they read it)."""
    from .cli_text import OS_ADVICE
    what = OS_ADVICE.get(exc.errno) or exc.strerror or str(exc)
    return ConversionError(f"cannot write the output: {what}; nothing was written", file=target)
