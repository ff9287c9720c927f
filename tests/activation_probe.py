"""Layer by layer: Quark's own input quantizer (from quark.torch's importer, on real activations of a real model) vs
the builder's ONNX activation subgraph on the same input tensor.

capture(export_dir, modules, ids) runs the importer model once over `ids` and records, for each named QParamsLinear,
its input x and Quark's fake-quantized input (input_quantizer(x)). compare(...) runs the ONNX subgraph that the
builder emits for that scheme (MXFP4 / NVFP4: ops/mx_activation.py; PTPC / dynamic FP8: ops/qdq.fp8_dynamic_unit
followed by the per-token rescale) on x and reports how many elements differ and by how much.
capture_linears / onnx_linear do the same for whole linears: Quark's QParamsLinear forward vs the scheme's own ONNX
emit (activation quantization + weight + GEMM) on the same real input.
CLI: python tests/activation_probe.py EXPORT_DIR [--modules N]   (prints one line per module)
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))


def capture(export_dir: Path, module_names: list[str] | None, ids: np.ndarray, limit: int = 6) -> dict:
    """{module: (x, quark_qx)} as float32 numpy, for the first `limit` quantized linears (or the named ones)."""
    import torch
    from quark.torch import import_model_from_safetensors

    model = import_model_from_safetensors(None, str(export_dir / "quark"), device="cpu").float().eval()
    found = {}
    hooks = []
    names = [n for n, m in model.named_modules() if getattr(m, "input_quantizer", None) is not None]
    chosen = module_names or names[:limit]
    for name, mod in model.named_modules():
        if name in chosen:
            def hook(m, args, name=name):
                x = args[0].detach()
                found[name] = (x.float().numpy().copy(), m.input_quantizer(x).detach().float().numpy().copy())
            hooks.append(mod.register_forward_pre_hook(hook))
    with torch.no_grad():
        model(input_ids=torch.from_numpy(ids.reshape(1, -1).astype(np.int64)), use_cache=False)
    for h in hooks:
        h.remove()
    return found


def onnx_qdq(x: np.ndarray, scheme: str, tmp: Path, input_scale_2: float | None = None) -> np.ndarray:
    """The builder's activation fake-quantization of x, run by ORT CPU."""
    import onnxruntime as ort

    from builder.graph import IO_DTYPES, IO_NUMPY, GraphBuilder
    from builder.ops.mx_activation import Fp4ActivationSpec, emit_fp4_activation_qdq
    from builder.ops.qdq import fp8_dynamic_unit

    class Ctx:
        io = "fp32"
        io_np = IO_NUMPY["fp32"]
        io_type = IO_DTYPES["fp32"]

        def __init__(self, graph):
            self.graph = graph

    tmp.mkdir(parents=True, exist_ok=True)
    g = GraphBuilder(tmp / "probe.onnx.data")
    ctx = Ctx(g)
    xin = g.input("x", IO_DTYPES["fp32"], list(x.shape))
    if scheme == "mxfp4":
        y = emit_fp4_activation_qdq(ctx, xin, Fp4ActivationSpec("mxfp4", 32), "/p")
    elif scheme == "nvfp4":
        y = emit_fp4_activation_qdq(ctx, xin, Fp4ActivationSpec("nvfp4", 16, input_scale_2=input_scale_2), "/p")
    else:
        u, s = fp8_dynamic_unit(ctx, xin, scheme == "ptpc_fp8", "/p")
        y = g.op("Mul", [u, s], "/p/rescale")
    g.node("Identity", [y], "/p/out", outputs=["y"])
    g.output("y", IO_DTYPES["fp32"], list(x.shape))
    g.finish(tmp / "probe.onnx")
    sess = ort.InferenceSession(str(tmp / "probe.onnx"), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


def compare(ours: np.ndarray, quark: np.ndarray) -> dict:
    d = np.abs(ours.astype(np.float64) - quark.astype(np.float64))
    return dict(mismatch=float((d > 0).mean()), max_abs=float(d.max()),
                rel_l2=float(np.linalg.norm(ours - quark) / max(np.linalg.norm(quark), 1e-30)))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("export_dir")
    ap.add_argument("--modules", type=int, default=6)
    args = ap.parse_args(argv)
    export = Path(args.export_dir)
    ref = np.load(export / "reference.npz")
    info = json.loads((export / "info.json").read_text())
    scheme = info["recipe"]["name"]
    found = capture(export, None, ref["eval_ids"], args.modules)
    from safetensors import safe_open
    with safe_open(str(export / "quark" / "model.safetensors"), "np") as f, \
            tempfile.TemporaryDirectory(prefix="probe.") as tmp:
        keys = set(f.keys())
        for name, (x, qx) in found.items():
            s2 = float(f.get_tensor(f"{name}.input_scale_2")) if f"{name}.input_scale_2" in keys else None
            ours = onnx_qdq(x, scheme.split("-")[0], Path(tmp) / name, s2)
            print(name, x.shape, compare(ours, qx), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())


# ------------------------------------------------------------------------------ whole linears

def capture_linears(export_dir: Path, module_names: list[str], ids: np.ndarray) -> dict:
    """{module: (x, quark_y)}: each named QParamsLinear's input and its full Quark forward (input quantizer, weight
    dequantization, F.linear) on real activations, from one importer forward over `ids`."""
    import torch
    from quark.torch import import_model_from_safetensors

    model = import_model_from_safetensors(None, str(export_dir / "quark"), device="cpu").float().eval()
    found, hooks = {}, []
    for name, mod in model.named_modules():
        if name in module_names:
            def hook(m, args, out, name=name):
                found[name] = (args[0].detach().float().numpy().copy(), out.detach().float().numpy().copy())
            hooks.append(mod.register_forward_hook(hook))
    with torch.no_grad():
        model(input_ids=torch.from_numpy(ids.reshape(1, -1).astype(np.int64)), use_cache=False)
    for h in hooks:
        h.remove()
    del model
    return found


def onnx_linear(export_dir: Path, name: str, x: np.ndarray, tmp: Path, options=None) -> np.ndarray:
    """The builder's ONNX form of one linear (its scheme's emit, CPU EP, fp32 io), run by ORT CPU on x."""
    import onnxruntime as ort

    from builder.convert import plan_model
    from builder.emit_context import EmitContext
    from builder.graph import IO_DTYPES, GraphBuilder

    plan, ckpt = plan_model(export_dir / "quark", "cpu", "fp32", options)
    try:
        tmp.mkdir(parents=True, exist_ok=True)
        g = GraphBuilder(tmp / "linear.onnx.data")
        ctx = EmitContext(g, ckpt, plan.ep, plan.io, plan.options, plan.quant)
        lp = plan.linears[name]
        xin = g.input("x", IO_DTYPES["fp32"], list(x.shape))
        y = lp.scheme.emit(ctx, lp, xin)
        g.node("Identity", [y], "/probe/out", outputs=["y"])
        g.output("y", IO_DTYPES["fp32"], list(x.shape[:-1]) + [lp.out_features])
        g.finish(tmp / "linear.onnx")
    finally:
        ckpt.close()
    sess = ort.InferenceSession(str(tmp / "linear.onnx"), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]
