"""Opening files of the input model folder: regular files only, symlinks resolved and kept inside the folder.

Every file the converter reads from `-i` goes through `open_input` / `read_input`, so a FIFO or a device in place of
a shard cannot hang the converter (opened with O_NONBLOCK, then fstat), a symlink loop or an unreadable file is one
ConversionError naming the file, and a symlink cannot lead the converter to read files outside the model folder.

Symlink targets must lie inside the model folder, with one exception: a Hugging Face cache snapshot
(`<repo>/snapshots/<rev>/` whose files link to `<repo>/blobs/<hash>`), where the blobs folder is allowed too.
"""
from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path

from .errors import ConversionError

MAX_JSON_BYTES = 64 << 20  # config.json / index / tokenizer config larger than this is not a config


def allowed_roots(model_dir: Path) -> list[Path]:
    root = Path(os.path.realpath(model_dir))
    roots = [root]
    if root.parent.name == "snapshots":  # Hugging Face cache layout: snapshots/<rev>/* -> ../../blobs/*
        roots.append(root.parent.parent / "blobs")
    return roots


def _within(path: Path, roots: list[Path]) -> bool:
    return any(path == r or r in path.parents for r in roots)


def open_input(path: Path, model_dir: Path) -> int:
    """A read-only fd of a regular file of the model folder (caller closes it)."""
    path = Path(path)
    try:
        real = Path(os.path.realpath(path, strict=True))
    except OSError as exc:
        raise _os_error(exc, path) from None
    except RuntimeError:  # Python < 3.13 reports a symlink loop this way
        raise ConversionError("symlink loop", file=path) from None
    if not _within(real, allowed_roots(model_dir)):
        raise ConversionError(f"symlink points outside the model folder (to {real})", file=path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise _os_error(exc, path) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ConversionError("not a regular file (FIFO, device or folder)", file=path)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_input(path: Path, model_dir: Path, limit: int = MAX_JSON_BYTES) -> bytes:
    fd = open_input(path, model_dir)
    try:
        size = os.fstat(fd).st_size
        if size > limit:
            raise ConversionError(f"file too large for a config file ({size} bytes)", file=path)
        chunks, total = [], 0
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:
                raise ConversionError("file too large for a config file", file=path)
        return b"".join(chunks)
    except OSError as exc:
        raise _os_error(exc, path) from None
    finally:
        os.close(fd)


def read_json(path: Path, model_dir: Path, *, want: type = dict):
    """A JSON file of the model folder, refused unless it is valid JSON of type `want` (dict: an object)."""
    raw = read_input(path, model_dir)
    try:
        value = json.loads(raw)
    except RecursionError:
        raise ConversionError("JSON nested too deeply", file=path) from None
    except ValueError as exc:  # includes UnicodeDecodeError
        raise ConversionError(f"not valid JSON ({str(exc).splitlines()[0]})", file=path) from None
    if not isinstance(value, want):
        raise ConversionError(f"must be a JSON {'object' if want is dict else want.__name__}", file=path,
                              value=_short(value), field="top level")
    return value


def exists(path: Path) -> bool:
    """True for anything at `path`, a dangling or looping symlink included (so it is refused, not skipped)."""
    return os.path.lexists(path)


def list_dir(model_dir: Path) -> list[str]:
    try:
        return sorted(os.listdir(model_dir))
    except OSError as exc:
        raise _os_error(exc, Path(model_dir)) from None


def _short(value) -> str:
    text = json.dumps(value)[:40]
    return text


def _os_error(exc: OSError, path: Path) -> ConversionError:
    reason = {errno.ELOOP: "symlink loop", errno.EACCES: "permission denied", errno.EPERM: "permission denied",
              errno.ENOENT: "file not found (or a dangling symlink)", errno.EISDIR: "is a folder"}
    return ConversionError(reason.get(exc.errno, exc.strerror or type(exc).__name__), file=path)
