"""What onnxruntime's CPU QMoE keeps in memory after pre-packing the 4-bit experts that builder/ops/moe.py emits
(uint4 block 32, packed zero points, fp32 scales, external data): the facts behind docs/benchmarks.md's "Why the QMoE
default holds 1.42x", measured on the installed onnxruntime so that an upgrade that changes them fails here.

From its source (contrib_ops/cpu/moe/moe_quantization_cpu.cc, QMoECPU::PrePack / PrePackQNBitExperts; mlas
sqnbitgemm_kernel_avx_common.h, QNBitGemmPackQuantBDataSize): at accuracy_level 4 (MLAS CompInt8) each expert stack is
copied into a packed buffer of 16 B codes + 4 B fp32 scale + 4 B fp32 block sum per 32-weight block and the weights'
initializer is released; the scales (inputs 3 / 6) are never marked packed, so their initializer (mmapped external
data, read once by PrePack) stays resident. At accuracy_level 1 (CompFp32) the buffer is the 16 B of codes alone and
PrePack does not read the scales. Measured here (benchmarks/qmoe_rss.py, fresh process per case, 64 experts of
hidden 1024 / width 512: 3 Mi blocks): anonymous RSS +24.5 B per block at level 4 and +16.5 at level 1 (the ~1.5
MiB above the packed bytes: onnxruntime's own allocations); file-backed RSS, over a session with pre-packing
disabled: +13.9 MiB at level 4 = the 12 MiB of scales and 1.5 MiB of zero points, +0.3 MiB at level 1.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from qmoe_rss import measure  # noqa: E402

E, H, I, BS = 64, 1024, 512, 32
BLOCKS = E * 3 * H * I // BS
SCALES_MIB = BLOCKS * 4 / 2**20
ZP_MIB = E * (2 * I * (H // BS // 2) + H * (I // BS // 2)) / 2**20


def grown(variant: str) -> tuple[float, float]:
    """(anonymous, file-backed) RSS growth in MiB from before the session to after its creation."""
    d = measure(variant, E, H, I, BS)
    b, c = d["before"], d["created"]
    return c["RssAnon"] - b["RssAnon"], c["RssFile"] - b["RssFile"]


@pytest.fixture(scope="module")
def measured():
    """al4_noprepack: session.disable_prepacking=1, which reads no initializer at creation: the file-backed pages
    every session touches (onnxruntime's own code, about 8.5 MiB) are the baseline of the file-backed figures."""
    return {v: grown(v) for v in ("al4", "al1", "al4_noprepack")}


def test_level4_packs_24_bytes_per_block(measured):
    anon, _ = measured["al4"]
    assert 23.5 <= anon * 2**20 / BLOCKS <= 25.5, f"{anon:.1f} MiB anonymous for {BLOCKS} blocks"


def test_level4_keeps_the_scales_resident(measured):
    """The file-backed growth at level 4 over the baseline is the scales and zero points PrePack read and kept."""
    extra = measured["al4"][1] - measured["al4_noprepack"][1]
    assert 0.9 * (SCALES_MIB + ZP_MIB) <= extra <= 1.1 * (SCALES_MIB + ZP_MIB) + 1, f"{extra:.1f} MiB"


def test_level1_packs_the_codes_only(measured):
    anon, file = measured["al1"]
    assert 15.5 <= anon * 2**20 / BLOCKS <= 17.5, f"{anon:.1f} MiB anonymous for {BLOCKS} blocks"
    extra = file - measured["al4_noprepack"][1]
    assert extra < 0.25 * SCALES_MIB, f"{extra:.1f} MiB file-backed: level 1 read the scales at creation"
