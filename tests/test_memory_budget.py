"""Peak memory of a conversion at a Llama-3 vocabulary (128256) does not grow with the vocabulary.

The export is benchmarks/synthetic_quark_export.py's `ci-vocab128k` (hidden 512, 2 uint4 layers, bf16 embedding and
lm_head of 128256 x 512: 131 MB each in the file, 263 MB each as fp32 in the output). The converter runs in a
subprocess and its own peak RSS comes from wait4 (not RUSAGE_CHILDREN, which would include every earlier child of
the test process). Measured: 115 MiB with QO_WORKERS=0, 175-185 MiB with the worker pipeline, against 68 MiB for a
tiny model (imports) and 681 MiB before row-block streaming. Holding one whole fp32 copy of the embedding or lm_head
again adds 251 MiB, which the budget below catches with headroom either way. The child also reports whether torch
was imported: the conversion path must not import it.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
from synthetic_quark_export import write  # noqa: E402

BUDGET_MIB = 320
# `python -m builder ...` that reports at exit whether torch was imported (the converter must not import it)
BUILDER = ("import atexit, runpy, sys; "
           "atexit.register(lambda: sys.stderr.write('torch imported: %s\\n' % ('torch' in sys.modules))); "
           "sys.argv = ['builder'] + sys.argv[1:]; runpy.run_module('builder', run_name='__main__', alter_sys=True)")


def peak_rss_mib(cmd: list[str]) -> tuple[int, float, str]:
    with open(os.devnull, "wb") as devnull, subprocess.Popen(cmd, cwd=REPO, stdout=devnull,
                                                             stderr=subprocess.PIPE) as proc:
        err = proc.stderr.read().decode(errors="replace")
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, usage.ru_maxrss / 1024, err


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
    vocab_tensors = 128256 * 512 * (4 + (1 if extra else 4))  # fp32 embedding + fp32 (or 8-bit) lm_head
    assert (out / "model.onnx.data").stat().st_size >= vocab_tensors
    assert peak <= BUDGET_MIB, f"peak RSS {peak:.0f} MiB > {BUDGET_MIB} MiB budget"
