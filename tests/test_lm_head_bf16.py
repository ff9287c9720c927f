"""Opt-in `--extra_options lm_head=bf16`: the bf16 float lm_head kept as the checkpoint's bf16 bits and multiplied by
the com.quark_onnx MatMulBf16 kernel (custom_ops library), exact up to float32 summation order.

References: numpy in float64 on the checkpoint's bits decoded independently (custom_ops/reference.py) for the
kernel; Quark's frozen model (reference.npz of the amd-quark export) and the default float build for the model."""
from __future__ import annotations

import ctypes
import subprocess
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file

from custom_ops import reference as ref
from custom_ops.single_op import profiled_nodes, session, single_op_model
from onnx_helpers import build, genai_greedy, op_types, prompt_logits
from test_cli_errors import run_builder

from ort_library_fixture import ort_ops_library  # noqa: F401  (fixture)

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "custom_ops" / "src"
# the shipped amd-quark export: bf16 checkpoint, lm_head excluded (float) by Quark's template; reference.npz holds
# Quark's own (bf16) logits
EXAMPLE = REPO / "examples" / "tiny-llama-uint4-quark"
# float32 sums of K products vs the float64 reference, relative to sum |a||w|: measured 1.2e-7 (K=2048)
REL_BOUND = {np.float32: 3e-7, np.float16: 4e-4}


def bf16_weight(rng, n, k) -> np.ndarray:
    return (rng.standard_normal((n, k)) * 0.05).astype(ml_dtypes.bfloat16)


def bound(a, w_bits) -> np.ndarray:
    return np.abs(a.astype(np.float64)) @ np.abs(ref.bf16_bits_to_float(w_bits).astype(np.float64)).T + 1e-30


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["fp32", "fp16"])
def test_kernel_in_ort_matches_reference(ort_ops_library, dtype):
    rng = np.random.default_rng(0)
    for batch, n, k in [((1,), 37, 64), ((3,), 130, 2048), ((2, 5), 67, 72), ((1, 1), 4, 16)]:
        w = bf16_weight(rng, n, k)
        a = rng.standard_normal(batch + (k,)).astype(dtype)
        sess = session(single_op_model("MatMulBf16", dtype, k, {"B": w}), library=ort_ops_library, profile=True)
        y = sess.run(None, {"A": a})[0]
        assert profiled_nodes(sess) == [("MatMulBf16", "CPUExecutionProvider")]
        assert y.dtype == dtype and y.shape == batch + (n,)
        bits = w.view(np.uint16)
        rel = np.max(np.abs(y.astype(np.float64) - ref.matmul_bf16(a, bits)) / bound(a, bits))
        assert rel <= REL_BOUND[dtype], f"{batch} N={n} K={k}: rel {rel:.3g}"


def test_function_fallback_equals_float_matmul():
    """Without the library ORT inlines the function (Cast + Transpose folded into one fp32 weight)."""
    rng = np.random.default_rng(1)
    w = bf16_weight(rng, 50, 96)
    a = rng.standard_normal((4, 96)).astype(np.float32)
    sess = session(single_op_model("MatMulBf16", np.float32, 96, {"B": w}), profile=True)
    y = sess.run(None, {"A": a})[0]
    ops = {name for name, _ in profiled_nodes(sess)}
    # the weight's Cast -> Transpose folded away (a Transpose would run on every call otherwise); the Cast left is A's
    assert "MatMulBf16" not in ops and "MatMul" in ops and ops <= {"Cast", "MatMul"}, ops
    bits = w.view(np.uint16)
    assert np.max(np.abs(y - ref.matmul_bf16(a, bits)) / bound(a, bits)) <= REL_BOUND[np.float32]


def _ctypes_matmul(lib_path: str, a: np.ndarray, bits: np.ndarray) -> np.ndarray:
    lib = ctypes.CDLL(lib_path)
    fn = lib.qo_matmul_bf16_f32
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64]
    a = np.ascontiguousarray(a, np.float32)
    bits = np.ascontiguousarray(bits, np.uint16)
    y = np.empty((a.shape[0], bits.shape[0]), np.float32)
    assert fn(a.ctypes.data, bits.ctypes.data, y.ctypes.data, a.shape[0], bits.shape[0], a.shape[1]) == 0
    return y


def test_same_bits_on_every_instruction_set_and_every_row_count(ort_ops_library, tmp_path):
    """The fixed summation order (custom_ops/src/qo_kernels.h: 8 lanes of fmaf, folded pairwise): the library (its
    AVX2+FMA path, picked at run time on x86) gives the same bits as a build with no SIMD dispatch (-DQO_NO_CLONES:
    the portable C path, baseline x86-64) and as that build for the build machine's own ISA (fmaf inlined), and a
    row's result does not depend on how many rows are computed with it (GEMV for M <= 4, register tiles above)."""
    rng = np.random.default_rng(2)
    k, n = 200, 77  # K % 32 != 0: the 8-element steps after the 32-element ones
    bits = bf16_weight(rng, n, k).view(np.uint16)
    a = (rng.standard_normal((6, k)) * np.logspace(-3, 3, k)).astype(np.float32)  # wide range: rounding matters
    y = _ctypes_matmul(ort_ops_library, a, bits)
    for i in range(6):
        assert np.array_equal(_ctypes_matmul(ort_ops_library, a[i:i + 1], bits)[0], y[i])
    variants = {"baseline": ["-DQO_NO_CLONES"], "native": ["-DQO_NO_CLONES", "-march=native"]}
    for label, flags in variants.items():
        lib = tmp_path / f"libqo_{label}.so"
        subprocess.run(["cc", "-O3", "-fPIC", "-shared", "-fopenmp", "-std=c99", *flags, "-I", str(SRC),
                        str(SRC / "qo_cpu_kernels.c"), str(SRC / "qo_version.c"), "-lm", "-o", str(lib)], check=True)
        assert np.array_equal(_ctypes_matmul(str(lib), a, bits), y), label
    # and the result is a float32 sum, not something coarser: within 3e-7 of the float64 reference
    assert np.max(np.abs(y - ref.matmul_bf16(a, bits)) / bound(a, bits)) <= REL_BOUND[np.float32]


def test_bf16_lm_head_model(ort_ops_library, tmp_path):
    export = EXAMPLE
    reference = np.load(export / "reference.npz")
    plain = build(export, tmp_path / "float", "cpu", "fp32", accuracy_level=1, lm_head="float")
    out = build(export, tmp_path / "bf16", "cpu", "fp32", accuracy_level=1, lm_head="bf16",
                custom_ops_library=ort_ops_library)
    assert op_types(out).get("MatMulBf16") == 1 and op_types(out).get("Gemm", 0) == 0
    # the stored weight is the checkpoint's bits, unchanged
    import onnx
    from onnx import numpy_helper
    model = onnx.load(str(out / "model.onnx"))
    stored = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}["lm_head.weight.bf16"]
    ckpt = load_file(str(export / "model.safetensors"))["lm_head.weight"]
    assert np.array_equal(np.asarray(stored).view(np.uint16), np.asarray(ckpt).view(np.uint16))

    ids = reference["input_ids"]
    nodes: list = []
    logits = prompt_logits(out, ids, custom_ops_library=ort_ops_library, profile_nodes=nodes)
    assert ("MatMulBf16", "CPUExecutionProvider") in nodes  # the kernel ran, not the function
    float_logits = prompt_logits(plain, ids)
    # same arithmetic as the float lm_head up to float32 summation order: measured 4.8e-7 on logits of std 0.77
    assert float(np.abs(logits - float_logits).max()) <= 5e-6
    # Quark's logits there come from its bf16 model (0.027 from the float build): no further from them than float
    assert float(np.abs(logits - reference["logits"]).max()) <= float(np.abs(float_logits - reference["logits"]).max()) + 1e-5
    # without the library (the function fallback) the graph gives the float build's logits
    assert float(np.abs(prompt_logits(out, ids) - float_logits).max()) <= 5e-6
    assert genai_greedy(out, ids) == genai_greedy(plain, ids)  # og.Generator loads the bundled library


@pytest.mark.parametrize("args,field", [(["-e", "cuda"], "cuda has no MatMulBf16 kernel"),
                                        (["-e", "rocm"], "rocm has no MatMulBf16 kernel")])
def test_bf16_lm_head_refused_off_cpu(tmp_path, args, field):
    r = run_builder("-i", EXAMPLE, "-o", tmp_path / "o", *args, "--extra_options", "lm_head=bf16")
    rc, err = r.returncode, r.stderr
    assert rc == 2 and field in err and "--extra_options lm_head" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()


def test_bf16_lm_head_refused_for_a_float32_checkpoint(tmp_path):
    from synthetic_export import write_synthetic_export
    src = write_synthetic_export(tmp_path / "src")  # float32 tensors
    r = run_builder("-i", src, "-o", tmp_path / "o", "-e", "cpu", "--extra_options", "lm_head=bf16")
    rc, err = r.returncode, r.stderr
    assert rc == 2 and "bf16 bits" in err and "F32" in err and len(err.strip().splitlines()) == 1


def _tied_example(tmp_path: Path) -> Path:
    """The shipped export with its lm_head dropped and tie_word_embeddings set (a tied bf16 model)."""
    import json
    import shutil

    from safetensors.numpy import save_file
    out = tmp_path / "tied_src"
    shutil.copytree(EXAMPLE, out)
    tensors = load_file(str(out / "model.safetensors"))
    del tensors["lm_head.weight"]
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((out / "config.json").read_text())
    cfg["tie_word_embeddings"] = True
    (out / "config.json").write_text(json.dumps(cfg))
    return out


def _initializer_users(model_dir: Path) -> dict[str, list[str]]:
    import onnx
    model = onnx.load(str(model_dir / "model.onnx"), load_external_data=False)
    names = {t.name for t in model.graph.initializer}
    users: dict[str, list[str]] = {}
    for node in model.graph.node:
        for i in node.input:
            if i in names:
                users.setdefault(i, []).append(node.op_type)
    return users


def test_bf16_embedding_and_tied_lm_head_share_one_table(ort_ops_library, tmp_path):
    src = _tied_example(tmp_path)
    plain = build(src, tmp_path / "float", "cpu", "fp32", accuracy_level=1, lm_head="float", embedding="float")
    out = build(src, tmp_path / "bf16", "cpu", "fp32", accuracy_level=1, lm_head="bf16", embedding="bf16",
                custom_ops_library=ort_ops_library)
    # float: the tied lm_head is the embedding's own fp32 initializer (Gather + Gemm); bf16: one bf16 table for both
    assert sorted(_initializer_users(plain)["model.embed_tokens.weight"]) == ["Gather", "Gemm"]
    users = _initializer_users(out)
    assert sorted(users["model.embed_tokens.weight.bf16"]) == ["Gather", "MatMulBf16"]
    assert not any(name.startswith(("model.embed_tokens.weight", "lm_head")) and not name.endswith(".bf16")
                   for name in users)
    table = 256 * 64
    assert (plain / "model.onnx.data").stat().st_size - (out / "model.onnx.data").stat().st_size == table * 2
    ids = np.load(EXAMPLE / "reference.npz")["input_ids"]
    logits = prompt_logits(out, ids, custom_ops_library=ort_ops_library)
    # the gathered rows are exact; the logits differ from the float build by float32 summation order only
    assert float(np.abs(logits - prompt_logits(plain, ids)).max()) <= 5e-6
    assert genai_greedy(out, ids) == genai_greedy(plain, ids)


def test_bf16_embedding_refusals(tmp_path):
    r = run_builder("-i", EXAMPLE, "-o", tmp_path / "o", "-e", "cuda", "--extra_options", "embedding=bf16")
    assert r.returncode == 2 and "embedding=bf16 is for the cpu EP" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "o").exists()
    from synthetic_export import write_synthetic_export
    src = write_synthetic_export(tmp_path / "src")  # float32 tensors
    r = run_builder("-i", src, "-o", tmp_path / "o", "-e", "cpu", "--extra_options", "embedding=bf16")
    assert r.returncode == 2 and "F32" in r.stderr and "--extra_options embedding" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "o").exists()
