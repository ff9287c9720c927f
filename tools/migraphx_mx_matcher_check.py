"""Which MatMuls of a converted -e rocm / -e migraphx model MIGraphX's GPU quantization pass turns into quant_dot,
on gfx950 (simplify_qdq with use_mx_quant: the MX FP4 GEMM) and on chips without MX intrinsics, without a GPU.

    python tools/migraphx_mx_matcher_check.py [--lib BUILD/lib] [--tokens 8] MODEL_DIR ...

Compiles tools/migraphx_mx_matcher_check.cpp once against a tools/migraphx_ref.sh build (its headers in the same
cache folder, clang++), then, per model, parses it with the prompt's input shapes (an 8-token prompt, the cache fed as
onnxruntime-genai feeds it: tools/migraphx_ref_compare.py; --tokens 1 for a one-token step, which takes a routed MoE
block's Gather branch where 8 tokens take its every-expert branch: the parser inlines the If branch its static shapes
choose, src/onnx/parse_if.cpp) and runs the start of the GPU target's required_pipeline
(normalize_ops, eliminate_identity, simplify_qdq) with use_mx_quant off and on. Prints per model the instruction
counts that matter: quant_dot_mx (4-input quant_dot, match_find_mx_quantizable_ops), quant_dot, dot, and the
quantizelinear/dequantizelinear left (a Q/DQ pair that remove_qdq_pairs dropped is gone from these counts).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import onnx

REPO = Path(__file__).resolve().parents[1]
SOURCE = REPO / "tools" / "migraphx_mx_matcher_check.cpp"
KEYS = ("quant_dot_mx", "quant_dot", "dot", "quantizelinear", "dequantizelinear", "pack_fp4")


def build_dir(lib: Path) -> Path:
    return lib.parent  # <cache>/<commit>/build


def binary(lib: Path) -> Path:
    """The compiled checker beside the build (rebuilt when the source is newer)."""
    cache = build_dir(lib).parent
    exe = cache / "mx_matcher_check"
    if exe.exists() and exe.stat().st_mtime >= SOURCE.stat().st_mtime:
        return exe
    b, s = build_dir(lib), cache / "src"
    inc = [f"-I{p}" for p in (b / "src/include", s / "src/include", b / "src/onnx/include", s / "src/onnx/include")]
    cmd = ["clang++", "-std=c++17", "-O0", "-g0", *inc, str(SOURCE), f"-L{lib}", "-lmigraphx", "-lmigraphx_onnx",
           f"-Wl,-rpath,{lib}", "-o", str(exe)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(f"compiling {SOURCE.name} failed: {r.stderr[-1500:]}")
    return exe


def input_dims(model_dir: Path, tokens: int = 8) -> list[str]:
    sys.path.insert(0, str(REPO / "tools"))
    from migraphx_ref_compare import BUFFER
    genai = json.loads((model_dir / "genai_config.json").read_text())
    shared = bool(genai["search"].get("past_present_share_buffer", False))
    model = onnx.load(str(model_dir / "model.onnx"), load_external_data=False)
    out = []
    for i in model.graph.input:
        dims = [d.dim_value for d in i.type.tensor_type.shape.dim]
        if i.name.startswith("past_key_values"):
            dims = [1, dims[1], BUFFER if shared else 0, dims[3]]
        else:
            dims = [1, tokens]
        out.append(f"{i.name}={','.join(map(str, dims))}")
    return out


def check(model_dir: Path, lib: Path, tokens: int = 8) -> dict[str, dict[str, int]]:
    exe = binary(lib)
    rows = {}
    for arch, flag in (("without_mx", "0"), ("gfx950", "1")):
        r = subprocess.run([str(exe), str(model_dir / "model.onnx"), flag, *input_dims(model_dir, tokens)],
                           capture_output=True, text=True, env=dict(os.environ, MIGRAPHX_DISABLE_WARNINGS="1"))
        if r.returncode:
            raise RuntimeError(f"{model_dir}: {r.stderr.strip().splitlines()[-1][:300]}")
        counts = json.loads(r.stdout.strip().splitlines()[-1])
        rows[arch] = {k: counts.get(k, 0) for k in KEYS}
    return rows


def default_lib() -> Path | None:
    sys.path.insert(0, str(REPO / "tests"))
    from test_migraphx_ref import migraphx_lib
    return migraphx_lib()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+", type=Path)
    ap.add_argument("--lib", type=Path, help="the build's lib folder (default: the newest tools/migraphx_ref.sh build)")
    ap.add_argument("--tokens", type=int, default=8, help="prompt length the model is parsed for (default 8)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    lib = args.lib or default_lib()
    if lib is None or not (lib / "libmigraphx.so").exists():
        print("error: no MIGraphX build (tools/migraphx_ref.sh); pass --lib BUILD/lib", file=sys.stderr)
        return 2
    report = {}
    for m in args.models:
        report[str(m)] = check(m, lib, args.tokens)
        print(m, json.dumps(report[str(m)]), flush=True)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
