"""What a benchmark writes about its own run into benchmarks/results: the command line without this machine's paths."""
from __future__ import annotations

import os
import re


def command_line(script: str, argv: list[str]) -> str:
    """`python SCRIPT ARGS` with every absolute path replaced by its option's name in capitals (`--work /tmp/x` ->
    `--work WORK`, `--root=/a` -> `--root=ROOT`), or PATH where it has none, so results never name a local path."""
    out = []
    for i, a in enumerate(argv):
        m = re.match(r"^(--[\w-]+)=(.*)$", a)
        if m and os.path.isabs(m.group(2)):
            a = f"{m.group(1)}={m.group(1)[2:].upper().replace('-', '_')}"
        elif os.path.isabs(a):
            prev = argv[i - 1] if i else ""
            a = prev[2:].upper().replace("-", "_") if prev.startswith("--") else "PATH"
        out.append(a)
    return " ".join(["python", script, *out])
