"""One error type for every input the converter refuses.

The CLI prints `ConversionError` as a single line (file, layer, config field, value, what is accepted) and exits 2.
"""
from __future__ import annotations

from pathlib import Path

from .cli_text import MAX_LINE, clip, clip_middle


class ConversionError(Exception):
    """Bad or unsupported input. Each keyword names where the problem is; all are optional."""

    def __init__(self, message: str, *, file: str | Path | None = None, layer: str | None = None,
                 field: str | None = None, value: object = None, accepted: str | None = None):
        self.message = message
        self.file = str(file) if file is not None else None
        self.layer = layer
        self.field = field
        self.value = value
        self.accepted = accepted
        super().__init__(self.one_line())

    def one_line(self) -> str:
        """At most MAX_LINE - len("error: ") characters: each part is cut with an ellipsis (paths in the middle)."""
        parts = []
        if self.file:
            parts.append(clip_middle(self.file, 160))
        if self.layer:
            parts.append(f"layer {clip_middle(self.layer, 100)}")
        if self.field:
            parts.append(f"{clip(self.field, 80)}={clip(repr(self.value), 80)}")
        where = ": ".join(parts)
        message = clip(self.message, 240)
        text = f"{where}: {message}" if where else message
        if self.accepted:
            text += f" (accepted: {clip(self.accepted, 160)})"
        return clip(text, MAX_LINE - len("error: "))


class Interrupted(BaseException):
    """SIGTERM / SIGHUP during a conversion (SIGINT is KeyboardInterrupt); the CLI exits with 128 + signum."""

    def __init__(self, signum: int):
        self.signum = signum
        super().__init__(signum)
