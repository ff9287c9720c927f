"""The GPU kernels (custom_ops/src/qo_gpu_kernels.cu), executed: built for the CPU with HIP-CPU and run at warp
sizes 32 and 64 on every format, against an independent float64 numpy decoding (custom_ops/gpu_cases.py).

Needs the HIP-CPU tarball (custom_ops/hip_cpu.py says where it is looked up) and g++; without them the tests skip,
and with QO_REQUIRE_HIP_CPU=1 (set by .ci/run) they fail instead.
"""

from __future__ import annotations

import os

import ml_dtypes
import numpy as np
import pytest

from custom_ops import gpu_cases as gc
from custom_ops import hip_cpu

QO_ERR_ARGUMENT = 1


@pytest.fixture(scope="module")
def libraries() -> dict:
    try:
        paths = hip_cpu.build(log=lambda message: None)
    except hip_cpu.Unavailable as why:
        if os.environ.get("QO_REQUIRE_HIP_CPU") == "1":
            pytest.fail(f"QO_REQUIRE_HIP_CPU=1 but {why}")
        pytest.skip(str(why))
    return {warp_size: hip_cpu.load(path) for warp_size, path in paths.items()}


def _memory(lib) -> gc.HostMemory:
    return gc.HostMemory(lib.qo_hip_cpu_synchronize)


# ---------------- the reference decoders themselves, code by code ----------------

def test_reference_decoders_agree_with_ml_dtypes():
    codes = np.arange(256, dtype=np.uint8)
    np.testing.assert_array_equal(gc.decode_e4m3fn(codes), codes.view(ml_dtypes.float8_e4m3fn).astype(np.float64))
    nibbles = np.arange(16, dtype=np.uint8)
    fp4 = np.array([ml_dtypes.float4_e2m1fn(v) for v in gc.decode_e2m1(nibbles)])
    assert np.array_equal(fp4.astype(np.float64), gc.decode_e2m1(nibbles))
    assert np.signbit(gc.decode_e2m1(nibbles))[8]  # code 8 is -0
    np.testing.assert_array_equal(gc.decode_e8m0(codes), codes.view(ml_dtypes.float8_e8m0fnu).astype(np.float64))
    bits = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    with np.errstate(invalid="ignore"):  # signalling NaN patterns
        np.testing.assert_array_equal(gc.decode_bf16(bits), bits.view(ml_dtypes.bfloat16).astype(np.float64))
    packed = np.array([[0x21, 0x8F]], dtype=np.uint8)
    assert gc.unpack_nibbles(packed).tolist() == [[1, 2, 15, 8]]  # element 2j = low nibble of byte j


# ---------------- the kernels ----------------

def test_build_has_the_warp_size_and_links_two_units(libraries):
    for warp_size, lib in libraries.items():
        assert lib.qo_hip_cpu_warp_size() == warp_size
        assert lib.qo_gpu_backend() == b"hip"
        assert lib.qo_hip_cpu_f16_to_f32(0x3C00) == 1.0  # qo_fp_formats.h from the second translation unit


@pytest.mark.parametrize("io", ["f32", "f16"])
@pytest.mark.parametrize("op", gc.OPS)
@pytest.mark.parametrize("warp_size", hip_cpu.WARP_SIZES)
def test_kernel_matches_float64_reference(libraries, warp_size, op, io):
    lib = libraries[warp_size]
    results = [gc.run_case(lib, _memory(lib), case) for case in gc.cases([op]) if case.io == io]
    failed = [r for r in results if not r["pass"]]
    assert not failed, f"warp {warp_size}: {failed}"


@pytest.mark.parametrize("io", ["f32", "f16"])
@pytest.mark.parametrize("op", gc.OPS)
@pytest.mark.parametrize("warp_size", hip_cpu.WARP_SIZES)
def test_one_hot_rows_give_each_decoded_weight_exactly(libraries, warp_size, op, io):
    """No sum to round: Y is one weight times the epilogue scale, exactly (-0 weights give +0: the sum starts at +0),
    on the gemv path (8 rows) and the tiled path (9 rows)."""
    lib = libraries[warp_size]
    for rows in (8, 9):
        case, inputs, expected = gc.one_hot_case(op, io, rows=rows)
        memory = _memory(lib)
        launch, y_pointer, y_like = gc.prepare(lib, memory, case, inputs)
        assert launch() == 0
        y = memory.download(y_pointer, y_like)
        memory.free_all()
        want = expected.astype(gc.IO_DTYPES[io])
        mismatch = np.argwhere(y != want)
        assert mismatch.size == 0, f"{rows} rows: {len(mismatch)} outputs differ, first at {mismatch[:3].tolist()}: " \
                                   f"{y[tuple(mismatch[0])]} vs {want[tuple(mismatch[0])]}"


def test_nvfp4_one_hot_case_tells_the_multiplication_orders_apart():
    """The exact test above can fail on the wrong NVFP4 order: (e2m1 * e4m3) * scale_2 differs from Quark's
    e2m1 * (e4m3 * scale_2) on some of its outputs."""
    differing = 0
    for rows in (8, 9):
        case, inputs, quark_order = gc.one_hot_case("nvfp4", "f32", rows=rows)
        picks = [c % case.K for c in gc.ONE_HOT_COLUMNS[:rows]]
        e2m1 = gc.decode_e2m1(gc.unpack_nibbles(inputs.arrays["B"])[:, picks].T).astype(np.float32)
        block = gc.decode_e4m3fn(inputs.arrays["B_scale"][:, [p // 16 for p in picks]].T).astype(np.float32)
        other_order = (e2m1 * block) * np.float32(inputs.scalars["B_scale_2"])
        differing += int(np.sum(other_order.view(np.uint32) != quark_order.view(np.uint32)))
    assert differing > 0


def test_bad_arguments_are_refused(libraries):
    lib = libraries[64]
    memory = _memory(lib)
    a = memory.upload(np.ones((2, 40), np.float32))
    b = memory.upload(np.zeros((4, 40), np.uint8))
    scale = memory.upload(np.ones(4, np.float32))
    y = memory.empty(2 * 4 * 4)
    assert lib.qo_gpu_matmul_nvfp4_f32(a, b, scale, 1.0, y, 2, 4, 40, None) == QO_ERR_ARGUMENT  # K % 16
    assert lib.qo_gpu_matmul_mxfp4_f32(a, b, scale, y, 2, 4, 40, None) == QO_ERR_ARGUMENT  # K % 32
    assert lib.qo_gpu_matmul_fp8_f32(a, b, scale, 3, y, 2, 4, 40, None) == QO_ERR_ARGUMENT  # B_scale count
    assert lib.qo_gpu_matmul_int8_f32(a, b, None, 1, y, 2, 4, 40, None) == QO_ERR_ARGUMENT  # no B_scale
    assert lib.qo_gpu_matmul_fp8_w8a8_dyn_f32(a, b, scale, 4, None, y, 2, 4, 40, None) == QO_ERR_ARGUMENT
    assert lib.qo_gpu_matmul_bf16_f32(a, b, y, 2, 4, 0, None) == QO_ERR_ARGUMENT  # K = 0
    assert lib.qo_gpu_matmul_bf16_f32(a, b, y, 0, 4, 40, None) == 0  # M = 0: nothing to do
    memory.free_all()
