"""tools/qemu_user.py: the FMA shim preloaded into qemu-x86_64 (tools/qemu_fma_shim.c) must compute what glibc's fmaf /
fma compute (correctly rounded a * b + c, one rounding), or the emulated CPU's FMA instructions would change, and it
must reach the QEMU process only, never the emulated program. No QEMU needed: the shim is loaded here with ctypes and
checked against exact rational arithmetic; the command line is checked as built."""
from __future__ import annotations

import ctypes
import shutil
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
import qemu_user


def _round_nearest_even(x: Fraction, bits: int, emin: int) -> Fraction:
    """x rounded to a binary format with `bits` significand bits and minimum normal exponent emin (no overflow)."""
    if x == 0:
        return x
    a = abs(x)
    e = a.numerator.bit_length() - a.denominator.bit_length()
    while Fraction(2) ** e > a:
        e -= 1
    while Fraction(2) ** (e + 1) <= a:
        e += 1
    ulp = Fraction(2) ** (max(e, emin) - bits + 1)
    q, r = divmod(a, ulp)
    if 2 * r > ulp or (2 * r == ulp and q % 2):
        q += 1
    return (q * ulp) if x > 0 else -(q * ulp)


def _cases(dtype, rng, n=1500):
    """Random a, b and a c that is random, or cancels a * b to within a few ulps (where one rounding matters)."""
    a = (rng.uniform(1, 2, n) * np.exp2(rng.integers(-20, 20, n))).astype(dtype)
    b = (rng.uniform(1, 2, n) * np.exp2(rng.integers(-20, 20, n))).astype(dtype) * rng.choice([-1, 1], n).astype(dtype)
    prod = (a * b).astype(dtype)
    kind = rng.integers(0, 3, n)
    nudge = np.exp2(-rng.integers(1, 30, n)).astype(dtype)
    c = np.where(kind == 0, (rng.standard_normal(n) * np.exp2(rng.integers(-30, 30, n))).astype(dtype),
                 np.where(kind == 1, -prod, -prod * (1 + nudge))).astype(dtype)
    return a, b, c


@pytest.fixture(scope="module")
def shim(tmp_path_factory):
    if not qemu_user.host_has_fma():
        pytest.skip("host without AVX + FMA: the wrapper runs plain QEMU there")
    if not (shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")):
        pytest.skip("no C compiler")
    return ctypes.CDLL(str(qemu_user.build_shim(tmp_path_factory.mktemp("shim") / "libqemu_fma_shim.so")))


@pytest.mark.parametrize("name, dtype, ctype, bits, emin", [("fmaf", np.float32, ctypes.c_float, 24, -126),
                                                           ("fma", np.float64, ctypes.c_double, 53, -1022)])
def test_shim_is_one_correctly_rounded_fma(shim, name, dtype, ctype, bits, emin):
    fn = getattr(shim, name)
    fn.restype, fn.argtypes = ctype, [ctype] * 3
    a, b, c = _cases(dtype, np.random.default_rng(7))
    wrong, unfused_differs = [], 0
    for x, y, z in zip(a.tolist(), b.tolist(), c.tolist()):
        exact = _round_nearest_even(Fraction(x) * Fraction(y) + Fraction(z), bits, emin)
        got = fn(x, y, z)
        if Fraction(got) != exact:
            wrong.append((x, y, z, got, float(exact)))
        unfused_differs += Fraction(float(dtype(dtype(x) * dtype(y)) + dtype(z))) != exact
    assert not wrong, f"{name}: {len(wrong)} of {len(a)} not correctly rounded, e.g. {wrong[0]}"
    assert unfused_differs > len(a) // 4, "the cases must tell a fused from an unfused multiply-add"
    assert str(fn(2.0, 3.0, -6.0)) == "0.0" and str(fn(1.0, -0.0, -0.0)) == "-0.0"  # IEEE 754 zero signs


def test_command_preloads_the_shim_into_qemu_only():
    shim = Path("/x/libqemu_fma_shim.so")
    cmd, env = qemu_user.qemu_command("Haswell", ["tools/isa_eval.py", "A"], {"PATH": "/bin"}, shim, python="/py")
    assert cmd == ["qemu-x86_64", "-U", "LD_PRELOAD", "-cpu", "Haswell", "/py", "tools/isa_eval.py", "A"]
    assert env == {"PATH": "/bin", "LD_PRELOAD": str(shim)}
    # the caller's own LD_PRELOAD goes to the emulated program, the shim to QEMU
    cmd, env = qemu_user.qemu_command("Haswell", ["s.py"], {"LD_PRELOAD": "/mine.so"}, shim, python="/py")
    assert cmd[:3] == ["qemu-x86_64", "-E", "LD_PRELOAD=/mine.so"] and env["LD_PRELOAD"] == str(shim)
    cmd, env = qemu_user.qemu_command("Haswell", ["s.py"], {"LD_PRELOAD": "/mine.so"}, None, python="/py")
    assert cmd == ["qemu-x86_64", "-cpu", "Haswell", "/py", "s.py"] and env == {"LD_PRELOAD": "/mine.so"}


def test_host_flags_and_elf_checks(tmp_path):
    assert qemu_user.host_has_fma("processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\n")
    assert not qemu_user.host_has_fma("flags\t\t: fpu sse2 avx\n")
    assert qemu_user.is_dynamic_elf(sys.executable)  # CPython on Linux: dynamically linked
    (tmp_path / "script").write_text("#!/bin/sh\n")
    assert not qemu_user.is_dynamic_elf(str(tmp_path / "script"))


def test_usage_errors_exit_2(capsys):
    assert qemu_user.main([]) == 2
    assert qemu_user.main(["--help"]) == 2
    assert "usage" in capsys.readouterr().err
