"""Peak memory of a conversion at a Llama-3 vocabulary (128256) does not grow with the vocabulary.

The export is benchmarks/synthetic_quark_export.py's `ci-vocab128k` (hidden 512, 2 uint4 layers, bf16 embedding and
lm_head of 128256 x 512: 131 MB each in the file, 263 MB each as fp32 in the output). The converter runs in a
subprocess that reports its own VmHWM at exit (not RUSAGE_CHILDREN, which would include every earlier child of the
test process, nor wait4, whose ru_maxrss includes the parent's pages the child held between fork and exec: 551 MiB
inside the full suite). Measured: 115 MiB with QO_WORKERS=0, 175-185 MiB with the worker pipeline, 193-225 MiB with
the writer thread's 64 MiB queue on top (builder/graph.py; 129-146 MiB with QO_WRITER_THREAD=0), against 68 MiB
for a tiny model (imports) and 681 MiB before row-block streaming. Holding one whole fp32 copy of the embedding or lm_head
again adds 251 MiB, which the budget below catches with headroom either way. The child also reports whether torch
was imported: the conversion path must not import it.
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
from synthetic_quark_export import write  # noqa: E402

BUDGET_MIB = 320
# `python -m builder ...` that reports at exit its own peak RSS (VmHWM: this process image only; wait4's ru_maxrss
# would also count the test process's memory that the child shared between fork and exec) and whether torch was
# imported (the converter must not import it).
BUILDER = ("import atexit, re, runpy, sys\n"
           "def report():\n"
           "    hwm = re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1)\n"
           "    sys.stderr.write('peak VmHWM kB: %s\\ntorch imported: %s\\n' % (hwm, 'torch' in sys.modules))\n"
           "atexit.register(report)\n"
           "sys.argv = ['builder'] + sys.argv[1:]\n"
           "runpy.run_module('builder', run_name='__main__', alter_sys=True)\n")


def peak_rss_mib(cmd: list[str]) -> tuple[int, float, str]:
    r = subprocess.run(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    hwm = re.search(r"peak VmHWM kB: (\d+)", r.stderr)
    return r.returncode, int(hwm.group(1)) / 1024 if hwm else float("inf"), r.stderr


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    root = tmp_path_factory.mktemp("vocab128k")
    return {tied: write(root / f"tied_{tied}", "ci-vocab128k", tied=tied) for tied in (False, True)}


@pytest.mark.parametrize("tied,extra", [(False, []), (True, []), (False, ["--extra_options", "lm_head=int8"])],
                         ids=["untied", "tied", "untied-int8"])
def test_peak_rss_stays_flat_at_vocab_128256(exports, tmp_path, tied, extra):
    out = tmp_path / "out"
    rc, peak, err = peak_rss_mib([sys.executable, "-c", BUILDER, "-i", str(exports[tied]), "-o", str(out),
                                  "-e", "cpu", *extra])
    assert rc == 0, err
    assert "torch imported: False" in err, err
    # the cpu default keeps the checkpoint's bf16 embedding and lm_head (docs/cpu_compact_forms.md): bf16 embedding +
    # bf16 (or 8-bit) lm_head; a tied bf16 lm_head is the embedding's own initializer
    vocab_tensors = 128256 * 512 * (2 + (1 if extra else 0 if tied else 2))
    size = (out / "model.onnx.data").stat().st_size
    assert vocab_tensors <= size < vocab_tensors + 128256 * 512 * 2, size
    assert peak <= BUDGET_MIB, f"peak RSS {peak:.0f} MiB > {BUDGET_MIB} MiB budget"
