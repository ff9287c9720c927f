"""The GPU kernel source compiles for CUDA (nvcc) and AMD HIP (hipcc), each skipped when its compiler is
absent. Nothing runs on a GPU here: custom_ops/gpu_check.py does that on a machine that has one."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "custom_ops" / "src"
GPU_SOURCE = SRC / "qo_gpu_kernels.cu"
EXPORTED = ("qo_gpu_matmul_mxfp4_f32", "qo_gpu_matmul_mxfp4_f16", "qo_gpu_matmul_fp8_w8a8_f32",
            "qo_gpu_matmul_fp8_w8a8_dyn_f16", "qo_gpu_matmul_fp8_f16", "qo_gpu_matmul_int8_f32",
            "qo_gpu_matmul_nvfp4_f16", "qo_gpu_matmul_bf16_f32", "qo_gpu_backend")


def _nvcc() -> str | None:
    return shutil.which("nvcc") or (str(Path("/usr/local/cuda/bin/nvcc")) if Path("/usr/local/cuda/bin/nvcc").exists() else None)


def test_cuda_kernels_compile_for_sm80_and_sm90(tmp_path):
    nvcc = _nvcc()
    if nvcc is None:
        pytest.skip("nvcc not found: CUDA compile check skipped (install the CUDA toolkit to run it)")
    command = [nvcc, "-c", "-O3", "-std=c++17", "-Xcompiler", "-fPIC", "-DQO_WITH_CUDA",
               "-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_90,code=sm_90",
               "-I", str(SRC), str(GPU_SOURCE), "-o", str(tmp_path / "qo_gpu_kernels.o")]
    # ~90 s of CPU for 7 formats x 2 io types x 2 paths x 2 archs; minutes of wall time on a loaded 2-core machine
    result = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr
    symbols = subprocess.run(["nm", "-g", str(tmp_path / "qo_gpu_kernels.o")], capture_output=True, text=True)
    if symbols.returncode == 0:
        for name in EXPORTED:
            assert f" T {name}" in symbols.stdout, f"{name} not exported with C linkage"


# One wave64 (CDNA2, MI200) and one wave32 (RDNA2) target, both known to every HIP since 5.x. gfx942 (MI300)
# is not known to HIP 5.2 (Debian 12's hipcc), so it is not requested here.
HIP_ARCHS = ("gfx90a", "gfx1030")


def _hipcc() -> str | None:
    return shutil.which("hipcc") or (str(Path("/opt/rocm/bin/hipcc")) if Path("/opt/rocm/bin/hipcc").exists() else None)


def _hip_env() -> dict[str, str]:
    # hipcc hands the source to nvcc when a CUDA toolkit is installed unless the platform is pinned.
    return {**os.environ, "HIP_PLATFORM": "amd"}


def _offload_targets(obj: Path, tmp_path: Path) -> set[str] | None:
    """AMD code objects embedded in a hipcc object (None when binutils/clang-offload-bundler are missing)."""
    bundler = shutil.which("clang-offload-bundler") or next(
        (str(p) for p in sorted(Path("/usr/lib").glob("llvm-*/bin/clang-offload-bundler"))), None)
    if bundler is None or shutil.which("objcopy") is None:
        return None
    fatbin = tmp_path / "hip_fatbin.bin"
    if subprocess.run(["objcopy", "-O", "binary", "--only-section=.hip_fatbin", str(obj), str(fatbin)]).returncode:
        return None
    listing = subprocess.run([bundler, "--list", "--type=o", f"--input={fatbin}"], capture_output=True, text=True)
    return {line.rsplit("--", 1)[-1] for line in listing.stdout.split() if "amdgcn" in line} if listing.returncode == 0 else None


def test_hip_kernels_compile_for_gfx90a_and_gfx1030(tmp_path):
    hipcc = _hipcc()
    if hipcc is None:
        pytest.skip("hipcc not found: HIP compile check skipped (Debian 12: apt-get install hipcc; not installed in CI)")
    obj = tmp_path / "qo_gpu_kernels_hip.o"
    command = [hipcc, "-c", "-O3", "-std=c++17", "-fPIC", "-DQO_WITH_HIP", "-x", "hip",
               *(f"--offload-arch={arch}" for arch in HIP_ARCHS), "-I", str(SRC), str(GPU_SOURCE), "-o", str(obj)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, env=_hip_env())
    assert result.returncode == 0, result.stderr
    symbols = subprocess.run(["nm", "-g", str(obj)], capture_output=True, text=True)
    if symbols.returncode == 0:
        for name in EXPORTED:
            assert f" T {name}" in symbols.stdout, f"{name} not exported with C linkage"
    targets = _offload_targets(obj, tmp_path)
    if targets is not None:
        assert targets == set(HIP_ARCHS), f"device code objects {targets}, expected {set(HIP_ARCHS)}"


def test_hip_cmake_build(tmp_path):
    hipcc, cmake = _hipcc(), shutil.which("cmake")
    if hipcc is None or cmake is None:
        pytest.skip("hipcc or cmake not found: CMake QO_WITH_HIP=ON check skipped (not installed in CI)")
    build = tmp_path / "build"
    configure = subprocess.run([cmake, "-S", str(SRC.parent), "-B", str(build), "-DQO_WITH_HIP=ON",
                                "-DCMAKE_HIP_ARCHITECTURES=" + ";".join(HIP_ARCHS)],
                               capture_output=True, text=True, timeout=300, env=_hip_env())
    assert configure.returncode == 0, configure.stdout + configure.stderr
    built = subprocess.run([cmake, "--build", str(build), "-j2"], capture_output=True, text=True, timeout=600,
                           env=_hip_env())
    assert built.returncode == 0, built.stdout + built.stderr
    symbols = subprocess.run(["nm", "-D", "--defined-only", str(build / "libquark_onnx_ops.so")],
                             capture_output=True, text=True)
    if symbols.returncode == 0:
        for name in (*EXPORTED, "qo_matmul_mxfp4_f32"):
            assert f" T {name}" in symbols.stdout, f"{name} not exported from libquark_onnx_ops.so"


def test_cuda_ort_library_builds_and_its_cpu_kernels_run_in_cpu_ort(tmp_path):
    """CMake QO_WITH_CUDA=ON + QO_WITH_ORT=ON (the library a CUDA session would register): it builds, and in a
    CPU-only onnxruntime it still registers and runs its CPU kernels (its CUDA kernels wait for a CUDA EP)."""
    import numpy as np

    from custom_ops import ort_headers
    from custom_ops import reference as ref
    from custom_ops.single_op import profiled_nodes, session, single_op_model

    nvcc, cmake, include = _nvcc(), shutil.which("cmake"), ort_headers.find()
    if nvcc is None or cmake is None or include is None:
        pytest.skip("nvcc, cmake or the ORT C API header missing (python -m custom_ops.ort_library fetches the header)")
    build = tmp_path / "build"
    configure = subprocess.run([cmake, "-S", str(SRC.parent), "-B", str(build), "-DQO_WITH_CUDA=ON", "-DQO_WITH_ORT=ON",
                                f"-DONNXRUNTIME_ROOT={include}", "-DCMAKE_CUDA_ARCHITECTURES=90",
                                f"-DCMAKE_CUDA_COMPILER={nvcc}"], capture_output=True, text=True, timeout=300)
    assert configure.returncode == 0, configure.stdout + configure.stderr
    built = subprocess.run([cmake, "--build", str(build), "-j2"], capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stdout + built.stderr
    library = build / "libquark_onnx_ops.so"
    symbols = subprocess.run(["nm", "-D", "--defined-only", str(library)], capture_output=True, text=True)
    if symbols.returncode == 0:
        for name in (*EXPORTED, "RegisterCustomOps", "qo_matmul_mxfp4_f32"):
            assert f" T {name}" in symbols.stdout, f"{name} not exported"
    rng = np.random.default_rng(3)
    b, s = ref.random_mxfp4_weight(rng, 24, 256)
    a = rng.standard_normal((5, 256)).astype(np.float32)
    sess = session(single_op_model("MatMulMxfp4", np.float32, 256, {"B": b, "B_scale": s}), library=str(library),
                   profile=True)
    y = sess.run(None, {"A": a})[0]
    assert profiled_nodes(sess) == [("MatMulMxfp4", "CPUExecutionProvider")]
    bound = np.abs(a.astype(np.float64)) @ np.abs(ref.dequantize_mxfp4(b, s)).T
    assert np.max(np.abs(y - ref.matmul_mxfp4(a.astype(np.float64), b, s)) / bound) <= 3e-7
