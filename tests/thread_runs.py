"""Run one Python snippet in fresh processes with 1 and 2 OpenMP threads (a kernel called through ctypes splits its
work with OpenMP) and return what each printed as JSON: the kernel tests compare the two for bit identity."""
from __future__ import annotations

import json
import os
import subprocess
import sys


def outputs_per_thread_count(script: str, counts=("1", "2")) -> list:
    results = []
    for threads in counts:
        env = dict(os.environ, OMP_NUM_THREADS=threads)
        out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
        results.append(json.loads(out.stdout))
    return results
