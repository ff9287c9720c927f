"""Resident memory of one com.microsoft QMoE node at session creation on the CPU EP: where a 4-bit expert stack's
bytes go when onnxruntime pre-packs it. One node at Qwen3-30B-A3B's expert shape (hidden 2048, 128 experts of width
768, top-8, uint4 block 32 with packed zero points, fp32 scales: what builder/ops/moe.py routed_moe emits), each
variant in a fresh process: RSS before the session, after creating it (VmRSS, its anonymous / file-backed split, the
peak VmHWM) and after one M = 1 run, against the node's initializer bytes.

    python benchmarks/qmoe_rss.py [--experts 128] [--hidden 2048] [--inter 768] [--bs 32]
                                  [--variants al4,al1,al4_noprepack,al4_inline,...]
    python benchmarks/qmoe_rss.py --model OUTPUT_DIR    # a converted output in a plain onnxruntime session
                                                        # (its genai_config's custom-op library registered), with
                                                        # and without session.disable_prepacking: the og-free view

Variants: al4 / al1 (accuracy_level 4: MLAS SQNBit CompInt8, or 1: CompFp32), with suffixes: _inline (initializers
inside the .onnx instead of external data), _bf16 / _fp16 (the scales as bfloat16 / float16, QMoE's T2, with float
activations), _wp1 (attribute weights_prepacked=1 on the raw weights), _noprepack (session option
session.disable_prepacking=1), _scales_input (the scales fed as graph inputs, not constant initializers).
Expected, from onnxruntime's source (contrib_ops/cpu/moe/moe_quantization_cpu.cc, QMoECPU::PrePack /
PrePackQNBitExperts; mlas sqnbitgemm_kernel_avx_common.h, QNBitGemmPackQuantBDataSize and ComputePackBlkSum):
at CompInt8 the packed buffer per 32-weight block is 16 B of codes + 4 B fp32 scale copy + 4 B fp32 block sum
(-scale * zero point), is_packed=true for the weights (their initializer is released) and is_packed=false for the
scales (inputs 3 / 6: they stay resident, read once by PrePack). tests/test_qmoe_prepack_memory.py holds this.
Results: docs/benchmarks.md ("Why the QMoE default holds 1.42x").
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np


def status() -> dict:
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        k, _, v = line.partition(":")
        if k in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
            out[k] = int(v.split()[0]) / 1024  # MiB
    return out


def build(path: Path, e: int, h: int, inter: int, bs: int, acc: int, inline: bool, scales_input: bool,
          scales_dtype: str = "float32", weights_prepacked: int = 0) -> int:
    import onnx
    from onnx import TensorProto, helper
    rng = np.random.default_rng(0)
    inits, ins = [], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, h]),
                      helper.make_tensor_value_info("router", TensorProto.FLOAT, [None, e])]
    names = {}
    nbytes = 0
    for fc, n, k in (("fc1", 2 * inter, h), ("fc2", h, inter)):
        w = rng.integers(0, 256, (e, n, k // 2), dtype=np.uint8)
        s = (rng.random((e, n, k // bs), dtype=np.float32) * 0.01 + 0.001).astype(np.float32)
        z = rng.integers(0, 256, (e, n, (k // bs + 1) // 2), dtype=np.uint8)
        for key, a in (("w", w), ("s", s), ("z", z)):
            nm = f"{fc}_{key}"
            names[nm] = nm
            if key == "s" and scales_dtype != "float32":
                a = _cast_scales(a, scales_dtype)
            nbytes += a.nbytes
            if key == "s" and scales_input:
                ins.append(helper.make_tensor_value_info(nm, TensorProto.FLOAT, list(a.shape)))
                np.save(path.with_name(nm + ".npy"), a)
            else:
                inits.append(_tensor(a, nm, scales_dtype if key == "s" else None))
    node = helper.make_node("QMoE", ["x", "router", "fc1_w", "fc1_s", "", "fc2_w", "fc2_s", "", "", "", "",
                                     "fc1_z", "fc2_z"], ["y"], domain="com.microsoft", k=8,
                            activation_type="swiglu", swiglu_fusion=1, activation_alpha=1.0, activation_beta=0.0,
                            normalize_routing_weights=1, use_sparse_mixer=0, expert_weight_bits=4, block_size=bs,
                            weights_prepacked=weights_prepacked, accuracy_level=acc)
    g = helper.make_graph([node], "qmoe", ins, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, h])],
                          inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 10
    if inline:
        onnx.save(m, str(path))
    else:
        onnx.save(m, str(path), save_as_external_data=True, location=path.name + ".data", size_threshold=1024)
    return nbytes


def _cast_scales(a: np.ndarray, dtype: str) -> np.ndarray:
    """bfloat16 as its uint16 bit pattern (round to nearest even; the scales of a Quark export are bf16 already),
    float16 as numpy's."""
    if dtype == "float16":
        return a.astype(np.float16)
    u = a.view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def _tensor(a: np.ndarray, name: str, dtype: str | None):
    from onnx import TensorProto, helper, numpy_helper
    if dtype == "bfloat16":
        return helper.make_tensor(name, TensorProto.BFLOAT16, a.shape, a.tobytes(), raw=True)
    return numpy_helper.from_array(a, name)


def child(path: str, nbytes: int, noprepack: bool, scales_input: bool, h: int, e: int) -> None:
    import onnxruntime as ort
    before = status()
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    if noprepack:
        so.add_session_config_entry("session.disable_prepacking", "1")
    if h == 0:  # --model: a converted output (model.onnx), created only
        cfg = json.loads((Path(path).parent / "genai_config.json").read_text())
        lib = cfg["model"]["decoder"]["session_options"].get("custom_ops_library")
        if lib:
            so.register_custom_ops_library(str(Path(path).parent / lib) if not os.path.isabs(lib) else lib)
        sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        created = status()
        del sess
        print(json.dumps({"before": before, "created": created, "ran": created, "init_mib": nbytes / 2**20}))
        return
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    created = status()
    feeds = {"x": np.random.default_rng(1).standard_normal((1, h), dtype=np.float32),
             "router": np.random.default_rng(2).standard_normal((1, e), dtype=np.float32)}
    if scales_input:
        for fc in ("fc1", "fc2"):
            feeds[f"{fc}_s"] = np.load(Path(path).with_name(f"{fc}_s.npy"))
    sess.run(None, feeds)
    ran = status()
    print(json.dumps({"before": before, "created": created, "ran": ran, "init_mib": nbytes / 2**20}))


def measure(variant: str, e: int, h: int, inter: int, bs: int) -> dict:
    """One variant (module docstring) in a fresh process: {"before", "created", "ran": /proc/self/status fields in
    MiB, "init_mib": the node's initializer bytes}. RuntimeError with the child's last line when it fails."""
    acc = 4 if variant.startswith("al4") else 1
    inline, noprepack, scales_input = "_inline" in variant, "_noprepack" in variant, "_scales_input" in variant
    sdt = "bfloat16" if "_bf16" in variant else "float16" if "_fp16" in variant else "float32"
    with tempfile.TemporaryDirectory() as td:
        path = Path(td) / "m.onnx"
        nb = build(path, e, h, inter, bs, acc, inline, scales_input, sdt, 1 if "_wp1" in variant else 0)
        r = subprocess.run([sys.executable, __file__, "--child", str(path), str(nb), str(int(noprepack)),
                            str(int(scales_input)), str(h), str(e)], check=False, capture_output=True, text=True,
                           env={**os.environ, "OMP_NUM_THREADS": "1"})
    if r.returncode:
        raise RuntimeError((r.stderr.strip().splitlines() or ["no output"])[-1])
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--experts", type=int, default=128)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--inter", type=int, default=768)
    ap.add_argument("--bs", type=int, default=32)
    ap.add_argument("--variants", default="al4,al1,al4_noprepack,al4_inline,al1_inline")
    ap.add_argument("--model", help="a converted output folder: its model.onnx in plain onnxruntime instead")
    ap.add_argument("--child", nargs=6, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        p, nb, npp, si, h, e = a.child
        child(p, int(nb), npp == "1", si == "1", int(h), int(e))
        return 0
    if a.model:
        return model_rss(Path(a.model))
    e, h, inter, bs = a.experts, a.hidden, a.inter, a.bs
    blocks = e * (2 * inter * h + h * inter) // bs
    print(f"QMoE E={e} hidden={h} inter={inter} block={bs}: {blocks} blocks of {bs} weights; "
          f"expected CompInt8 packed buffer (16 B codes + 4 B scale + 4 B block sum per block): "
          f"{blocks * 24 / 2**20:.1f} MiB; fp32 scales {blocks * 4 / 2**20:.1f} MiB, "
          f"codes {blocks * 16 / 2**20:.1f} MiB")
    print("| variant | initializers MiB | RSS after session - before (anon / file) MiB | peak (VmHWM) - before | "
          "after 1 run - before | session / initializers |")
    print("|---|---|---|---|---|---|")
    for v in a.variants.split(","):
        try:
            d = measure(v, e, h, inter, bs)
        except RuntimeError as err:
            print(f"| {v} | failed: {str(err)[:200]} |||||")
            continue
        b, c, rn = d["before"], d["created"], d["ran"]
        print(f"| {v} | {d['init_mib']:.1f} | {c['VmRSS'] - b['VmRSS']:.1f} ({c['RssAnon'] - b['RssAnon']:.1f} / "
              f"{c['RssFile'] - b['RssFile']:.1f}) | {c['VmHWM'] - b['VmRSS']:.1f} | "
              f"{rn['VmRSS'] - b['VmRSS']:.1f} | {(rn['VmRSS'] - b['VmRSS']) / d['init_mib']:.2f} |", flush=True)
    return 0


def model_rss(out: Path) -> int:
    """Plain onnxruntime on a converted output: RSS after session creation, with and without pre-packing."""
    nb = sum(f.stat().st_size for f in out.iterdir() if f.is_file() and not f.name.startswith("tokenizer")
             and f.suffix not in (".json", ".so", ".txt"))
    print(f"{out.name}: output (model.onnx + data) {nb / 2**20:.1f} MiB")
    print("| session | RSS after session - before (anon / file) MiB | peak (VmHWM) - before | session / output |")
    print("|---|---|---|---|")
    for noprepack in (False, True):
        r = subprocess.run([sys.executable, __file__, "--child", str(out / "model.onnx"), str(nb), str(int(noprepack)),
                            "0", "0", "0"], check=False, capture_output=True, text=True,
                           env={**os.environ, "OMP_NUM_THREADS": "1"})
        if r.returncode:
            print(f"| {'no prepacking' if noprepack else 'default'} | failed: {r.stderr.strip()[-300:]} |||")
            continue
        d = json.loads(r.stdout.strip().splitlines()[-1])
        b, c = d["before"], d["created"]
        print(f"| {'session.disable_prepacking=1' if noprepack else 'default'} | {c['VmRSS'] - b['VmRSS']:.1f} "
              f"({c['RssAnon'] - b['RssAnon']:.1f} / {c['RssFile'] - b['RssFile']:.1f}) | "
              f"{c['VmHWM'] - b['VmRSS']:.1f} | {(c['VmRSS'] - b['VmRSS']) / d['init_mib']:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
