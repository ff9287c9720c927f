"""Do the ONNX forms that MIGraphX would lower to gfx950's native OCP-FP8 and MX-FP4 GEMMs parse, and does its
`ref` target compute them as an independent numpy decoding does?

    PYTHONPATH=<tools/migraphx_ref.sh build>/build/lib python tools/migraphx_gfx950_probe.py [--json OUT]

Each probe is a one-MatMul graph (x [3, 64] fp32 -> [3, 16]); the row says: parse/compile/run error, or the max
|difference| from numpy. ONNX Runtime CPU has no kernel for float4e2m1 Quantize/DequantizeLinear (docs/
execution_providers.md, cpu-no-fp4-qdq), so the FP4 probes are checked against numpy, whose e2m1 rounding
(nearest, ties to even, saturating at 6) and e8m0 scales are written here, not taken from the builder.

  fp8_ocp_qdq      QuantizeLinear/DequantizeLinear with a float8e4m3fn zero point (x) and a float8e4m3fn weight
                   initializer: the form an OCP-FP8 W8A8 GEMM would take (match_find_quantizable_ops -> quant_dot).
  fp4_initializer  DequantizeLinear(float4e2m1 initializer [64, 16], blocked scale [2, 16], axis 0, block 32).
  fp4_q_act        x -> QuantizeLinear(blocked scale, output_dtype float4e2m1, axis 1, block 32) -> DequantizeLinear
                   -> MatMul(float weight): MX activation quantization through the parser's pack_fp4/unpack_fp4
                   path (src/op/builder/quantizelinear.cpp handle_fp4x2).
  mx_dot           both MatMul operands DequantizeLinear(QuantizeLinear(..., float4e2m1), blocked scale): the
                   pattern src/simplify_qdq.cpp match_find_mx_quantizable_ops turns into a 4-input quant_dot when
                   gfx_has_mx_intrinsics() (gfx950). The weight enters as int8 2*e2m1 codes (today's dq_int8
                   bytes), DequantizeLinear(0.5) to the e2m1 values, QuantizeLinear(scale 1) to float4e2m1, then
                   DequantizeLinear with the e8m0 block scales: a Q/DQ pair on constants, which propagate_constant
                   folds up to pack_fp4 (it stops at unpack_fp4: src/propagate_constant.cpp skip_propagate).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

M, K, N, G = 3, 64, 16, 32
E2M1 = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6], np.float32)


def e2m1_round(v: np.ndarray) -> np.ndarray:
    """Nearest e2m1 value, ties to the even code, saturating at +-6 (the OCP MX spec's conversion)."""
    grid = E2M1[:8]
    d = np.abs(np.minimum(np.abs(v), 6.0)[..., None] - grid)
    cand = d == d.min(-1, keepdims=True)
    even = cand & (np.arange(8) % 2 == 0)
    idx = np.where(even.any(-1), even.argmax(-1), cand.argmax(-1))
    return (np.sign(v) * grid[idx]).astype(np.float32)


def _model(nodes, inits, opset=23):
    g = h.make_graph(nodes, "probe", [h.make_tensor_value_info("x", T.FLOAT, [M, K])],
                     [h.make_tensor_value_info("y", T.FLOAT, [M, N])], inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", opset)])
    m.ir_version = 10
    return m


def probes(rng) -> dict[str, tuple[onnx.ModelProto, np.ndarray, np.ndarray]]:
    x = (rng.standard_normal((M, K)) * 2).astype(np.float32)
    out = {}
    # OCP FP8 W8A8 per tensor
    w8 = rng.standard_normal((K, N)).astype(np.float32)
    import ml_dtypes
    w8q = w8.astype(ml_dtypes.float8_e4m3fn)
    sx, sw = np.float32(0.02), np.float32(0.5)
    wt = onnx.helper.make_tensor("w8", T.FLOAT8E4M3FN, [K, N], w8q.view(np.uint8).tobytes(), raw=True)
    zp = onnx.helper.make_tensor("zp", T.FLOAT8E4M3FN, [], np.zeros(1, np.uint8).tobytes(), raw=True)
    nodes = [h.make_node("QuantizeLinear", ["x", "sx", "zp"], ["xq"]),
             h.make_node("DequantizeLinear", ["xq", "sx", "zp"], ["xd"]),
             h.make_node("DequantizeLinear", ["w8", "sw"], ["wd"]),
             h.make_node("MatMul", ["xd", "wd"], ["y"])]
    xd = np.clip(x / sx, -448, 448).astype(ml_dtypes.float8_e4m3fn).astype(np.float32) * sx
    out["fp8_ocp_qdq"] = (_model(nodes, [nh.from_array(sx, "sx"), nh.from_array(sw, "sw"), wt, zp], 21),
                          x, xd @ (w8q.astype(np.float32) * sw))
    # FP4 weights: codes and e8m0 block scales
    codes = rng.integers(0, 16, (K, N))
    wv = E2M1[codes]
    ws = (2.0 ** rng.integers(-3, 2, (K // G, N))).astype(np.float32)
    w = wv * np.repeat(ws, G, 0)
    packed = (codes.reshape(-1)[0::2] | (codes.reshape(-1)[1::2] << 4)).astype(np.uint8)
    w4 = onnx.helper.make_tensor("w4", T.FLOAT4E2M1, [K, N], packed.tobytes(), raw=True)
    nodes = [h.make_node("DequantizeLinear", ["w4", "ws"], ["w"], axis=0, block_size=G),
             h.make_node("MatMul", ["x", "w"], ["y"])]
    out["fp4_initializer"] = (_model(nodes, [w4, nh.from_array(ws, "ws")]), x, x @ w)
    # MX activations (scale given as an input-independent constant here: the graph's own scale math is plain ops)
    amax = np.abs(x.reshape(M, K // G, G)).max(-1)
    sxb = (2.0 ** (np.floor(np.log2(amax)) - 2)).astype(np.float32)          # [M, K/G]
    xq = e2m1_round(x / np.repeat(sxb, G, 1)) * np.repeat(sxb, G, 1)
    wf = rng.standard_normal((K, N)).astype(np.float32)
    nodes = [h.make_node("QuantizeLinear", ["x", "sxb"], ["xq"], axis=1, block_size=G, output_dtype=T.FLOAT4E2M1),
             h.make_node("DequantizeLinear", ["xq", "sxb"], ["xd"], axis=1, block_size=G),
             h.make_node("MatMul", ["xd", "wf"], ["y"])]
    out["fp4_q_act"] = (_model(nodes, [nh.from_array(sxb, "sxb"), nh.from_array(wf, "wf")]), x, xq @ wf)
    # both operands MX
    doubled = (2 * wv).astype(np.int8)
    nodes = nodes[:2] + [
        h.make_node("DequantizeLinear", ["w2", "half"], ["wv"]),
        h.make_node("QuantizeLinear", ["wv", "ones"], ["wq"], axis=0, block_size=G, output_dtype=T.FLOAT4E2M1),
        h.make_node("DequantizeLinear", ["wq", "ws"], ["wd"], axis=0, block_size=G),
        h.make_node("MatMul", ["xd", "wd"], ["y"])]
    inits = [nh.from_array(sxb, "sxb"), nh.from_array(doubled, "w2"), nh.from_array(np.float32(0.5), "half"),
             nh.from_array(np.ones_like(ws), "ones"), nh.from_array(ws, "ws")]
    out["mx_dot"] = (_model(nodes, inits), x, xq @ w)
    return out


def run_all(tmp: Path) -> dict[str, dict]:
    import migraphx
    rows = {}
    for name, (model, x, expect) in probes(np.random.default_rng(0)).items():
        path = tmp / f"{name}.onnx"
        onnx.save(model, str(path))
        stage = "parse"
        try:
            prog = migraphx.parse_onnx(str(path), map_input_dims={"x": [M, K]})
            stage = "compile"
            prog.compile(migraphx.get_target("ref"))
            stage = "run"
            y = np.array(prog.run({"x": migraphx.argument(np.ascontiguousarray(x))})[0])
            rows[name] = {"ok": True, "max_abs_diff": float(np.abs(y.astype(np.float32) - expect).max()),
                          "scale": float(np.abs(expect).max())}
        except Exception as e:  # noqa: BLE001 - the stage and MIGraphX's message are the result
            rows[name] = {"ok": False, "stage": stage, "error": str(e).strip().splitlines()[0][:300]}
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        rows = run_all(Path(tmp))
    for name, r in rows.items():
        print(f"{name}: " + (f"parses, runs; max |ref - numpy| {r['max_abs_diff']:.1e} (|y| <= {r['scale']:.1f})"
                             if r["ok"] else f"{r['stage']} error: {r['error']}"))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
