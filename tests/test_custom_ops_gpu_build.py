"""The GPU kernel source compiles for CUDA (and HIP when hipcc exists). Nothing runs on a GPU here:
custom_ops/gpu_check.py does that on a machine that has one."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "custom_ops" / "src"
GPU_SOURCE = SRC / "qo_gpu_kernels.cu"


def _nvcc() -> str | None:
    return shutil.which("nvcc") or (str(Path("/usr/local/cuda/bin/nvcc")) if Path("/usr/local/cuda/bin/nvcc").exists() else None)


def test_cuda_kernels_compile_for_sm80_and_sm90(tmp_path):
    nvcc = _nvcc()
    if nvcc is None:
        pytest.skip("nvcc not found: CUDA compile check skipped (install the CUDA toolkit to run it)")
    command = [nvcc, "-c", "-O3", "-std=c++17", "-Xcompiler", "-fPIC", "-DQO_WITH_CUDA",
               "-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_90,code=sm_90",
               "-I", str(SRC), str(GPU_SOURCE), "-o", str(tmp_path / "qo_gpu_kernels.o")]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    symbols = subprocess.run(["nm", "-g", str(tmp_path / "qo_gpu_kernels.o")], capture_output=True, text=True)
    if symbols.returncode == 0:
        for name in ("qo_gpu_matmul_mxfp4_f32", "qo_gpu_matmul_mxfp4_f16", "qo_gpu_matmul_fp8_w8a8_f32",
                     "qo_gpu_matmul_fp8_w8a8_dyn_f16", "qo_gpu_backend"):
            assert f" T {name}" in symbols.stdout, f"{name} not exported with C linkage"


def test_hip_kernels_compile(tmp_path):
    hipcc = shutil.which("hipcc")
    if hipcc is None:
        pytest.skip("hipcc not found: HIP compile check skipped (Debian 12: apt-get install hipcc)")
    command = [hipcc, "-c", "-O3", "-std=c++17", "-fPIC", "-DQO_WITH_HIP", "-x", "hip", "-I", str(SRC),
               str(GPU_SOURCE), "-o", str(tmp_path / "qo_gpu_kernels_hip.o")]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
