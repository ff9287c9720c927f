"""One error type for every input the converter refuses.

The CLI prints `ConversionError` as a single line (file, layer, config field, value, what is accepted) and exits 2.
"""
from __future__ import annotations

from pathlib import Path


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
        parts = []
        if self.file:
            parts.append(self.file)
        if self.layer:
            parts.append(f"layer {self.layer}")
        if self.field:
            parts.append(f"{self.field}={self.value!r}")
        where = ": ".join(parts)
        text = f"{where}: {self.message}" if where else self.message
        if self.accepted:
            text += f" (accepted: {self.accepted})"
        return " ".join(text.split())


class Interrupted(BaseException):
    """SIGTERM / SIGHUP during a conversion (SIGINT is KeyboardInterrupt); the CLI exits with 128 + signum."""

    def __init__(self, signum: int):
        self.signum = signum
        super().__init__(signum)
