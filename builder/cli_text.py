"""What the command line prints when something outside the model goes wrong.

- Every error or warning line is at most MAX_LINE characters: long values, names and paths are cut with an ellipsis.
- A closed stdout/stderr pipe (`python -m builder inspect ... | head -1`) ends the command quietly.
- An OSError on a path the user gave is one line naming that path, what went wrong and what to do.
- A missing optional package names the pip extra that installs it.
"""
from __future__ import annotations

import errno
import os
import sys

MAX_LINE = 400
ELLIPSIS = "…"
EXIT_CLOSED_PIPE = 141  # 128 + SIGPIPE: what `cat` or `grep` report when the reader of their output went away

# pip extra (pyproject.toml [project.optional-dependencies]) that installs each optional import
EXTRAS = {"torch": "quantize", "transformers": "quantize", "quark": "quantize", "tokenizers": "quantize",
          "gguf": "test", "accelerate": "test", "pytest": "test", "hypothesis": "test"}
PIP_NAMES = {"quark": "amd-quark"}

OS_ADVICE = {
    errno.ENAMETOOLONG: "a file or folder name is too long for the file system (at most 255 bytes per name); "
                        "choose a shorter one",
    errno.EACCES: "permission denied; choose a folder you can write to, or fix its permissions",
    errno.EPERM: "operation not permitted; choose a folder you can write to, or fix its permissions",
    errno.EROFS: "the file system is read-only; choose a folder on a writable one",
    errno.ENOSPC: "no space left on the device; free some space or choose another disk",
    errno.EDQUOT: "disk quota exceeded; free some space or choose another disk",
    errno.EFBIG: "file too large for the file system or the file-size limit (ulimit -f)",
    errno.ENOTDIR: "a part of the path is a file, not a folder",
    errno.ELOOP: "too many levels of symbolic links",
    errno.ENOENT: "no such file or folder",
}


def clip(text: object, limit: int) -> str:
    """`text` on one line, cut to `limit` characters with an ellipsis at the end."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:max(0, limit - 1)] + ELLIPSIS


def clip_middle(text: object, limit: int) -> str:
    """Cut in the middle (paths: the start and the file name both stay readable)."""
    text = " ".join(str(text).split())
    if len(text) <= limit:
        return text
    head = (limit - 1) // 2
    return text[:head] + ELLIPSIS + text[len(text) - (limit - 1 - head):]


def line(prefix: str, text: str) -> str:
    """`prefix text` cut to MAX_LINE characters."""
    return clip(f"{prefix}{text}", MAX_LINE)


def os_error_text(exc: OSError, path: object = None) -> str:
    """One line for an OSError: the user's path (not ours), what went wrong, what to do."""
    shown = clip_middle(path if path is not None else (exc.filename or ""), 160)
    what = OS_ADVICE.get(exc.errno) or (exc.strerror or type(exc).__name__)
    return f"{shown}: {what}" if shown else what


def missing_package_text(module: str, what: str = "this command") -> str:
    top = (module or "").split(".")[0]
    extra = EXTRAS.get(top)
    pip_name = PIP_NAMES.get(top, top)
    fix = (f'pip install -e ".[{extra}]" (from the repository root)' if extra else f"pip install {pip_name}")
    return f"{what} needs the Python package {pip_name}, which is not installed: {fix}"


def require(modules: tuple[str, ...], what: str) -> str | None:
    """The one-line message for the first of `modules` that cannot be imported, or None when all can."""
    import importlib.util
    for module in modules:
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            return missing_package_text(module, what)
    return None


def silence_closed_pipe() -> None:
    """After EPIPE: point stdout and stderr at /dev/null so the interpreter's final flush does not complain."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
    except OSError:
        return
    for stream in (sys.stdout, sys.stderr):
        try:
            os.dup2(devnull, stream.fileno())
        except (OSError, ValueError, AttributeError):
            pass
    os.close(devnull)


def run_quietly_on_closed_pipe(main, argv=None) -> int:
    """main(argv), flushing stdout before returning; a closed pipe anywhere (output, --help, an error line)
    ends it with EXIT_CLOSED_PIPE and nothing printed."""
    try:
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse --help / usage errors: flush while the handler can still see EPIPE
            sys.stdout.flush()
            sys.stderr.flush()
            raise exc
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        silence_closed_pipe()
        return EXIT_CLOSED_PIPE
