"""A progress bar for long conversions, drawn on stderr only when stderr is a terminal and -q is not given.

One line redrawn in place: `[2/3] ####------ 12/40 linears  35.2 MiB written  ETA 0:14`. Off a terminal (a pipe, a
file, a CI log) nothing is drawn: the step lines of convert.py are all that is printed.
"""
from __future__ import annotations

import os
import sys
import time

WIDTH = 24          # characters of the bar itself
MIN_INTERVAL = 0.1  # seconds between redraws


def bar_wanted(stream=None, quiet: bool = False) -> bool:
    stream = stream or sys.stderr
    if quiet or os.environ.get("TERM") == "dumb":
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def format_eta(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


def bar_line(done: int, total: int, written_bytes: int, elapsed: float) -> str:
    filled = WIDTH * done // max(total, 1)
    eta = format_eta(elapsed / done * (total - done)) if done else "?"
    return (f"[2/3] {'#' * filled}{'-' * (WIDTH - filled)} {done}/{total} linears  "
            f"{written_bytes / 2**20:.1f} MiB written  ETA {eta}")


class ProgressBar:
    def __init__(self, total: int, written=lambda: 0, stream=None):
        self.total, self.written, self.stream = total, written, stream or sys.stderr
        self.start = self.last = time.perf_counter()
        self.done = 0
        self.width = 0

    def step(self) -> None:
        self.done += 1
        now = time.perf_counter()
        if now - self.last < MIN_INTERVAL and self.done < self.total:
            return
        self.last = now
        text = bar_line(self.done, self.total, self.written(), now - self.start)
        self.stream.write("\r" + text + " " * max(0, self.width - len(text)))
        self.stream.flush()
        self.width = len(text)

    def close(self) -> None:
        if self.width:
            self.stream.write("\r" + " " * self.width + "\r")
            self.stream.flush()
