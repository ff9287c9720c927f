"""Per layer and position: where the builder's ONNX graph (ORT CPU) first leaves Quark's importer on a real export,
measured against how far Quark's own one-ulp nudge (tests/real_model.py _noise_floor_logits) moves Quark.

    python tools/layer_probe.py EXPORT_DIR [--tokens N] [--onnx DIR]

For every quantized linear (in forward order) it records the linear's *input* (before its activation quantizer) and
its output, from
  quark   quark.torch.import_model_from_safetensors on the export (fp32, its quantizers active)
  nudged  the same model with every quantized linear's output times (1 + N(0, 2^-23))
  onnx    the converted model run by onnxruntime (intermediate tensors exposed as graph outputs)
and prints, per linear: max |onnx - quark| / max |quark| of the input and the output, the same for nudged, and the
first position where onnx's input differs from Quark's at all, plus how many of the activation quantizer's codes
differ (the quantized input, compared exactly).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))


def quark_model(export: Path):
    """Quark's importer; for attention_scheme exports (the importer needs CUDA there) the frozen in-memory model,
    quantized again from the recipe in info.json (tests/real_model.py)."""
    info = json.loads((export / "info.json").read_text())
    if info["recipe"].get("attention_scheme"):
        from quark_factory import recipe_from_dict
        from real_model import _quantized_reference
        return _quantized_reference(export.parent.parent, recipe_from_dict(info["recipe"]), None)[0]
    from quark.torch import import_model_from_safetensors
    return import_model_from_safetensors(None, str(export / "quark"), device="cpu").float().eval()


def quark_trace(export: Path, ids: np.ndarray, nudge: bool, model=None) -> dict:
    """{module: (x, qx, y)} for every QParamsLinear, in forward order."""
    import torch

    model = model if model is not None else quark_model(export)
    found, hooks = {}, []
    gen = torch.Generator().manual_seed(0)
    for name, mod in model.named_modules():
        if getattr(mod, "input_quantizer", None) is None and not hasattr(mod, "_get_qweight") \
                and getattr(mod, "_weight_quantizer", None) is None:
            continue

        def hook(m, args, out, name=name):
            x = args[0].detach()
            iq = getattr(m, "input_quantizer", None) or getattr(m, "_input_quantizer", None)
            qx = iq(x) if iq is not None else x
            found[name] = (x.float().numpy()[0].copy(), qx.detach().float().numpy()[0].copy(),
                           out.detach().float().numpy()[0].copy())
            if nudge:
                return out * (1 + torch.randn(out.shape, generator=gen) * 2.0 ** -23)
        hooks.append(mod.register_forward_hook(hook))
    with torch.no_grad():
        logits = model(input_ids=torch.from_numpy(ids.reshape(1, -1).astype(np.int64)), use_cache=False).logits
    for h in hooks:
        h.remove()
    found["logits"] = (None, None, logits[0].float().numpy())
    return found


def onnx_trace(onnx_dir: Path, ids: np.ndarray, names: list[str]) -> dict:
    """{module: (x, qx, y)} from the ONNX graph: the linear's MatMul input/output and its quantizer's input."""
    import onnx
    import onnxruntime as ort

    m = onnx.load(str(onnx_dir / "model.onnx"), load_external_data=False)
    producers = {o: n for n in m.graph.node for o in n.output}
    wanted, extra = {}, []
    for name in names:
        hf = name.replace("model.layers.", "").split(".")  # [idx, self_attn|mlp, proj]
        idx, proj = hf[0], hf[-1]
        prefix = f"/model/layers.{idx}/{'attn' if hf[1] == 'self_attn' else 'mlp'}/{proj}/"
        # the projection's GEMM: MatMul, MatMulNBits, MatMulInteger or one of our compact forms (MatMulFp8, ...)
        mm = [n for n in m.graph.node if n.name.startswith(prefix) and n.op_type.startswith("MatMul")]
        if not mm:
            continue
        node = mm[-1]
        qx = node.input[0]
        # the quantizer's input: walk up until a node outside this projection's activation subgraph
        x = qx
        seen = 0
        while x in producers and ("Act/" in producers[x].name or "/Quant" in producers[x].name
                                  or "Dequant" in producers[x].op_type or "Quantize" in producers[x].op_type
                                  or "/input_q" in producers[x].name) and seen < 40:
            p = producers[x]
            x = p.input[0]
            seen += 1
        wanted[name] = (x, qx, node.output[0])
        extra += [x, qx, node.output[0]]
    have = {o.name for o in m.graph.output}
    for t in dict.fromkeys(extra):
        if t not in have:
            m.graph.output.append(onnx.helper.make_empty_tensor_value_info(t))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.onnx"
        onnx.save(m, str(path), save_as_external_data=False) if False else None
        # keep the external data where it is: write the modified graph next to it
        path = onnx_dir / "probe.onnx"
        onnx.save(m, str(path))
        sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feeds = {}
    t = ids.size
    for i in sess.get_inputs():
        if i.name == "input_ids":
            feeds[i.name] = ids.reshape(1, -1).astype(np.int64 if "int64" in i.type else np.int32)
        elif i.name == "attention_mask":
            feeds[i.name] = np.ones((1, t), np.int64 if "int64" in i.type else np.int32)
        elif i.name == "position_ids":
            feeds[i.name] = np.arange(t, dtype=np.int64).reshape(1, -1)
        elif i.name.startswith("past_key_values"):
            shape = [1 if d == "batch_size" else (0 if isinstance(d, str) else d) for d in i.shape]
            feeds[i.name] = np.zeros(shape, np.float32 if "float)" in i.type else np.float16)
    outs = [o.name for o in sess.get_outputs()]
    res = dict(zip(outs, sess.run(None, feeds)))
    found = {k: tuple(res[n][0] for n in v) for k, v in wanted.items()}
    found["logits"] = (None, None, res["logits"][0])
    return found


def rel(a, b):
    return float(np.abs(a.astype(np.float64) - b).max() / max(np.abs(b).max(), 1e-30))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("export_dir")
    ap.add_argument("--tokens", type=int, default=0, help="first N evaluation tokens (0: all)")
    ap.add_argument("--onnx", help="an already converted model folder")
    ap.add_argument("--json", help="write the per-linear figures here")
    ap.add_argument("--prompt", type=int, help="use reference.npz promptN instead of the evaluation text")
    args = ap.parse_args(argv)
    export = Path(args.export_dir)
    ref = np.load(export / "reference.npz")
    ids = ref[f"prompt{args.prompt}"] if args.prompt is not None else ref["eval_ids"]
    ids = ids[:args.tokens] if args.tokens else ids
    onnx_dir = Path(args.onnx) if args.onnx else Path(tempfile.mkdtemp(prefix="probe."))
    if not args.onnx:
        from builder.convert import convert
        convert(export / "quark", onnx_dir, "cpu", log=lambda m: None)
    model = quark_model(export)
    q = quark_trace(export, ids, False, model)
    n = quark_trace(export, ids, True, model)
    names = [k for k in q if k != "logits"]
    o = onnx_trace(onnx_dir, ids, names)
    rows = []
    first_leave = None
    for name in names + ["logits"]:
        if name not in o:
            continue
        qx_, qq, qy = q[name]
        nx, nq, ny = n[name]
        ox, oq, oy = o[name]
        row = dict(name=name, y_onnx=rel(oy, qy), y_nudge=rel(ny, qy))
        if qx_ is not None:
            row.update(x_onnx=rel(ox, qx_), x_nudge=rel(nx, qx_),
                       codes_onnx=float((oq != qq).mean()), codes_nudge=float((nq != qq).mean()),
                       first_pos_onnx=int(np.argmax(np.any(ox != qx_, axis=-1))) if np.any(ox != qx_) else -1,
                       first_pos_codes=int(np.argmax(np.any(oq != qq, axis=-1))) if np.any(oq != qq) else -1,
                       pos_x_onnx=np.abs(ox - qx_).max(-1).tolist(), pos_x_nudge=np.abs(nx - qx_).max(-1).tolist())
            if first_leave is None and row["x_onnx"] > 2 * max(row["x_nudge"], 1e-7):
                first_leave = name
        rows.append(row)
        print(f"{name:42s} x onnx {row.get('x_onnx', float('nan')):.2e} nudge {row.get('x_nudge', float('nan')):.2e}"
              f" | codes onnx {row.get('codes_onnx', float('nan')):.4f} nudge {row.get('codes_nudge', float('nan')):.4f}"
              f" | y onnx {row['y_onnx']:.2e} nudge {row['y_nudge']:.2e} | first pos {row.get('first_pos_onnx')}"
              f"/{row.get('first_pos_codes')}", flush=True)
    print("first linear whose input leaves Quark by more than 2x the nudge:", first_leave)
    if args.json:
        Path(args.json).write_text(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
