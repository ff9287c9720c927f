"""Real-size CPU outputs of the published Quark schemes: the compact default against the old fp32-dense form.

    python benchmarks/real_size.py [--work DIR] [--layers 2] [--vocab 32000] [--rounds 2] [--only fp8_kv,...]

For each release shape it writes a layer-sliced, format-exact synthetic Quark export (the tensor names, dtypes, shapes
and quantization_config of a real amd-quark export of that scheme: benchmarks/real_size_quant_configs.json holds the
configs amd-quark wrote for the tiny test fixtures, tests/quark_factory.py; random weights), converts it for `-e cpu`
twice, with the default (compact) and with `--extra_options custom_ops_library=none` (the dense fp32 forms of
before), and loads each in onnxruntime-genai in a fresh process, the two forms interleaved (A, B, A, B).

Per row: output / export bytes extrapolated to the full model (per-layer bytes x the real depth, vocabulary-sized
tensors x the real vocabulary; the runtime slice uses a smaller vocabulary to stay under 5 GiB); load and decode
RSS (VmHWM after load / after decoding); decode tok/s and prefill ms (128 tokens) as measured on the slice, and as
ratios to the fp32-dense form of the same run; GB/s streamed at decode (the bytes the session's weights hold per
token, the embedding excepted, times tok/s) and that as a share of the machine's plain memory-read bandwidth measured
in the same run (a C loop over 1 GiB, 1 and 2 threads, before and after, best; og uses both cores, so the share is
of the 2-thread read). Writes benchmarks/results/real_size.{json,md}.

Shapes (public configs): Llama-3.1-8B (hidden 4096, intermediate 14336, 32 layers, 32/8 heads, vocab 128256) as
FP8 W8A8 + FP8 KV (amd/Llama-3.1-8B-Instruct-FP8-KV's scheme), PTPC FP8, NVFP4, MXFP4 and INT8 W8A8.
Not covered (MoE): gpt-oss-20b MXFP4 and Qwen3-30B-A3B uint4 / MXFP4. Their experts are emitted by builder/ops/moe.py
(issue #18), not by the dense linear forms measured here, and the synthetic writer has no MoE layout yet.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import ml_dtypes
import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]
from synthetic_quark_export import BF16, SAFETENSORS_NAMES, eager, normal_bf16, save_shard  # noqa: E402

SAFETENSORS_NAMES.update({np.dtype(ml_dtypes.float8_e4m3fn): "F8_E4M3", np.dtype(np.uint8): "U8",
                          np.dtype(np.int8): "I8"})  # the writer's dtype table, with the quantized dtypes

CONFIGS = json.loads((REPO / "benchmarks" / "real_size_quant_configs.json").read_text())
LLAMA_8B = dict(hidden=4096, inter=14336, layers=32, heads=32, kv_heads=8, vocab=128256)
PROJECTIONS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
               "mlp.up_proj", "mlp.down_proj")


def _scalar(value: float) -> np.ndarray:
    return np.array(value, np.float32)


def _fp8(rng, n: int, k: int, per_channel: bool) -> np.ndarray:
    """e4m3fn codes as Quark's FP8 export makes them: a Gaussian weight divided by its scale max|w| / 448 (per tensor
    or per output channel) and cast. Uniformly random codes would make 1 in 16 codes zero or subnormal, which almost
    never happens in a quantized weight (|w| < 2^-6 of the scale, about 4e-5 of the max) and which sends a 32-element
    chunk of the CPU kernel's decode down its slower exact route (qo_cpu_kernels.c): with random codes nearly every
    chunk did, and the FP8 rows measured that route, not the one real weights take."""
    w = rng.standard_normal((n, k), dtype=np.float32)
    amax = np.abs(w).max(axis=1, keepdims=True) if per_channel else np.abs(w).max()
    return (w / (amax / np.float32(448))).astype(ml_dtypes.float8_e4m3fn)


def linear_tensors(scheme: str, rng, proj: str, n: int, k: int) -> dict[str, np.ndarray]:
    """The tensors amd-quark writes for one nn.Linear of this scheme (names, dtypes and shapes of the fixtures)."""
    if scheme in ("fp8_kv", "ptpc"):
        t = {"weight": _fp8(rng, n, k, per_channel=scheme == "ptpc")}
        if scheme == "ptpc":  # per-channel weight, dynamic per-token activation: no input scale
            t["weight_scale"] = rng.uniform(2e-5, 1e-4, n).astype(np.float32)
        else:
            t["weight_scale"], t["input_scale"] = _scalar(5e-5), _scalar(0.02)
            if proj in ("self_attn.k_proj", "self_attn.v_proj"):
                t["output_scale"] = _scalar(0.05)
        return t
    if scheme == "int8":
        return {"weight": rng.integers(-127, 128, size=(n, k), dtype=np.int8), "weight_scale": _scalar(2e-4),
                "weight_zero_point": np.array(0, np.int8), "input_scale": _scalar(0.02),
                "input_zero_point": np.array(0, np.int8)}
    packed = rng.integers(0, 256, size=(n, k // 2), dtype=np.uint8)
    if scheme == "mxfp4":
        return {"weight": packed, "weight_scale": rng.integers(118, 124, size=(n, k // 32), dtype=np.uint8)}
    assert scheme == "nvfp4"
    block = rng.uniform(0.5, 8.0, size=(n, k // 16)).astype(ml_dtypes.float8_e4m3fn)
    return {"weight": packed, "weight_scale": block, "weight_scale_2": _scalar(2e-3), "input_scale_2": _scalar(0.01)}


# the compact form asked for explicitly: the default chooses it only where the shipped library has the op's kernel
# (builder/compact_forms.py missing_kernels); this run measures the form either way and says which ran
COMPACT_OPTION = {"fp8_kv": "fp8_linear=compact", "ptpc": "fp8_linear=compact", "int8": "int8_linear=compact",
                  "mxfp4": "fp4_linear=compact", "nvfp4": "fp4_linear=compact"}
SCHEMES = {  # row name -> (synthetic scheme, config key of real_size_quant_configs.json, release it stands for)
    "fp8_kv": ("fp8_kv", "fp8_w8a8_kv", "Llama-3.1-8B FP8 W8A8 + FP8 KV"),
    "ptpc": ("ptpc", "ptpc_fp8", "Llama-3.1-8B PTPC FP8"),
    "nvfp4": ("nvfp4", "nvfp4", "Llama-3.1-8B NVFP4"),
    "mxfp4": ("mxfp4", "mxfp4", "Llama-3.1-8B MXFP4 (dense stand-in for gpt-oss's MXFP4 linears)"),
    "int8": ("int8", "int8_w8a8", "Llama-3.1-8B INT8 W8A8"),
}


def write_export(out: Path, scheme: str, layers: int, vocab: int) -> Path:
    s = LLAMA_8B
    kind, config_key, _ = SCHEMES[scheme]
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    hidden, inter, head_dim = s["hidden"], s["inter"], s["hidden"] // s["heads"]
    kv = head_dim * s["kv_heads"]
    shapes = {"self_attn.q_proj": (hidden, hidden), "self_attn.k_proj": (kv, hidden),
              "self_attn.v_proj": (kv, hidden), "self_attn.o_proj": (hidden, hidden),
              "mlp.gate_proj": (inter, hidden), "mlp.up_proj": (inter, hidden), "mlp.down_proj": (hidden, inter)}
    names = {}
    first = {"model.embed_tokens.weight": normal_bf16(rng, vocab, hidden), "model.norm.weight": eager(np.ones(hidden, BF16)),
             "lm_head.weight": normal_bf16(rng, vocab, hidden)}
    save_shard(out / "model-00000.safetensors", first)
    names.update(dict.fromkeys(first, "model-00000.safetensors"))
    for i in range(layers):
        p = f"model.layers.{i}"
        tensors = {f"{p}.input_layernorm.weight": eager(np.ones(hidden, BF16)),
                   f"{p}.post_attention_layernorm.weight": eager(np.ones(hidden, BF16))}
        for proj, (n, k) in shapes.items():
            for suffix, value in linear_tensors(kind, rng, proj, n, k).items():
                tensors[f"{p}.{proj}.{suffix}"] = eager(np.array(value, order="C"))  # 0-d stays 0-d
        shard = f"model-{i + 1:05d}.safetensors"
        save_shard(out / shard, tensors)
        names.update(dict.fromkeys(tensors, shard))
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": names}))
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
           "intermediate_size": inter, "num_hidden_layers": layers, "num_attention_heads": s["heads"],
           "num_key_value_heads": s["kv_heads"], "head_dim": head_dim, "vocab_size": vocab,
           "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
           "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                            "original_max_position_embeddings": 8192},
           "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "bfloat16",
           "quantization_config": CONFIGS[config_key]}
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    (out / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))
    sys.path.insert(0, str(REPO / "tests"))
    from tiny_tokenizer import write_tokenizer  # a byte-level BPE og can load (token ids are fed directly)
    write_tokenizer(out)
    return out


# ---- sizes ------------------------------------------------------------------------------------------------------
LAYER = re.compile(r"model\.layers\.(\d+)\.")


def _split_bytes(items, vocab: int) -> dict:
    """{"layer": bytes of one layer (mean), "vocab": bytes of vocabulary-sized tensors, "other": the rest}."""
    layers, per_vocab, other = {}, 0, 0
    for name, shape, nbytes in items:
        m = LAYER.search(name)
        if m:
            layers[m.group(1)] = layers.get(m.group(1), 0) + nbytes
        elif shape and shape[0] == vocab:
            per_vocab += nbytes
        else:
            other += nbytes
    return {"layer": sum(layers.values()) / max(1, len(layers)), "vocab": per_vocab, "other": other}


def export_items(export: Path):
    import struct
    for f in sorted(export.glob("*.safetensors")):
        with open(f, "rb") as fh:
            header = json.loads(fh.read(struct.unpack("<Q", fh.read(8))[0]))
        for name, v in header.items():
            if name != "__metadata__":
                yield name, v["shape"], v["data_offsets"][1] - v["data_offsets"][0]


def output_items(model_dir: Path):
    import onnx
    model = onnx.load(str(model_dir / "model.onnx"), load_external_data=False)
    for t in model.graph.initializer:
        size = int(np.prod(t.dims, dtype=np.int64)) * onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
        yield t.name, list(t.dims), size


def full_bytes(split: dict, vocab: int, layers: int = LLAMA_8B["layers"], real_vocab: int = LLAMA_8B["vocab"]) -> float:
    return split["layer"] * layers + split["vocab"] * real_vocab / vocab + split["other"]


# ---- conversion and og runs (children) --------------------------------------------------------------------------
def convert(export: Path, out: Path, extra: list[str]) -> dict:
    if out.exists():
        shutil.rmtree(out)
    cmd = [sys.executable, "-m", "builder", "-i", str(export), "-o", str(out), "-e", "cpu", "-q"]
    if extra:
        cmd += ["--extra_options", *extra]
    t = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)))
    if r.returncode:
        raise SystemExit(f"conversion failed: {' '.join(cmd)}\n{r.stderr[-2000:]}")
    return {"convert_s": round(time.perf_counter() - t, 1), "warnings": [ln for ln in r.stderr.splitlines()
                                                                       if ln.startswith("warning")]}


def child_run(model_dir: str, prefill_len: int, tokens: int) -> dict:
    import onnxruntime_genai as og

    def hwm() -> int:
        with open("/proc/self/status") as fh:
            return round(int(re.search(r"VmHWM:\s+(\d+)", fh.read()).group(1)) / 1024)

    t = time.perf_counter()
    model = og.Model(model_dir)
    out = {"load_s": round(time.perf_counter() - t, 2), "load_rss_mib": hwm()}
    vocab = json.loads((Path(model_dir) / "genai_config.json").read_text())["model"]["vocab_size"]
    rng = np.random.default_rng(0)
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=prefill_len + tokens + 1, min_length=0)
    warm = og.Generator(model, params)
    warm.append_tokens(rng.integers(3, vocab, size=(1, 8), dtype=np.int32))  # first run: prepacking
    del warm
    gen = og.Generator(model, params)
    t = time.perf_counter()
    gen.append_tokens(rng.integers(3, vocab, size=(1, prefill_len), dtype=np.int32))
    out["prefill_ms"] = round((time.perf_counter() - t) * 1e3, 1)
    gen.generate_next_token()
    t, n = time.perf_counter(), 0
    while n < tokens and not gen.is_done():
        gen.generate_next_token()
        n += 1
    out["decode_tps"] = round(n / (time.perf_counter() - t), 3)
    out["decode_rss_mib"] = hwm()
    return out


def run_child(model_dir: Path, prefill_len: int, tokens: int) -> dict:
    r = subprocess.run([sys.executable, __file__, "_child", str(model_dir), str(prefill_len), str(tokens)],
                       capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(REPO)))
    if r.returncode:
        why = (r.stderr.strip().splitlines() or [f"exit code {r.returncode}"])[-1][:300]
        return {"error": f"killed by signal {-r.returncode} (out of memory?)" if r.returncode < 0 else why}
    return json.loads(r.stdout.strip().splitlines()[-1])


def shipped_kernels(model_dir: Path) -> frozenset:
    """The kernel entry points of the custom-op library an output ships (empty without one)."""
    from builder.custom_ops_library import exported_kernels
    cfg = json.loads((model_dir / "genai_config.json").read_text())["model"]["decoder"]
    library = cfg.get("session_options", {}).get("custom_ops_library")
    return exported_kernels(str(model_dir / library)) if library else frozenset()


def session_weight_bytes(model_dir: Path) -> dict:
    """Bytes a decode step streams, per form: com.quark_onnx weights as stored when the shipped library has the op's
    kernel, else as ORT constant-folds them (float32 [K, N]); every other 2-D float weight as stored; the embedding
    (one row gathered per token) left out."""
    import onnx
    from builder.custom_ops_library import OP_SYMBOLS
    symbols = shipped_kernels(model_dir)
    model = onnx.load(str(model_dir / "model.onnx"), load_external_data=False)
    sizes = {t.name: (list(t.dims), int(np.prod(t.dims, dtype=np.int64))
                      * onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize) for t in model.graph.initializer}
    streamed, seen = 0, set()
    for node in model.graph.node:
        if node.domain == "com.quark_onnx":
            weights = [i for i in node.input[1:] if i in sizes]
            seen.update(weights)
            if OP_SYMBOLS.get(node.op_type) in symbols:
                streamed += sum(sizes[w][1] for w in weights)
            else:
                attrs = {a.name: a.i for a in node.attribute}
                dims = sizes[node.input[1]][0]
                streamed += 4 * attrs.get("N", dims[0]) * attrs.get("K", int(np.prod(dims[1:])))
        elif node.op_type in ("MatMul", "Gemm", "MatMulNBits"):
            for i in node.input[1:]:
                if i in sizes and i not in seen and len(sizes[i][0]) >= 2:
                    streamed += sizes[i][1]
                    seen.add(i)
    return {"streamed_bytes_per_token": streamed}


def kernels_used(model_dir: Path) -> dict[str, str]:
    """{com.quark_onnx op: "kernel" | "function (folded to fp32 at load)"} for the ops of the output."""
    import onnx
    from builder.custom_ops_library import OP_SYMBOLS
    symbols = shipped_kernels(model_dir)
    ops = {n.op_type for n in onnx.load(str(model_dir / "model.onnx"), load_external_data=False).graph.node
           if n.domain == "com.quark_onnx"}
    return {op: "kernel" if OP_SYMBOLS.get(op) in symbols else "function (folded to fp32 at load)" for op in ops}


def table(rows: list[dict]) -> str:
    head = ("| shape | form | output / export (full depth) | output GB | load RSS / output | decode RSS MiB | "
            "decode tok/s (x dense) | prefill 128 ms (x dense) | GB/s streamed (of plain read) |")
    lines = [head, "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            size = f"{r['ratio_to_export']:.2f}x | {r['output_gb_full']:.2f} (export {r['export_gb_full']:.2f})" \
                if "ratio_to_export" in r else " | "
            lines.append(f"| {r['release']} | {r['form']} | {size} | {r['error']} |||||")
            continue
        of_read = f" ({100 * r['gbps_of_read']:.0f} % of read)" if "gbps_of_read" in r else ""
        lines.append(
            f"| {r['release']} | {r['form']} | {r['ratio_to_export']:.2f}x | {r['output_gb_full']:.2f} "
            f"(export {r['export_gb_full']:.2f}) | {r['load_rss_mib'] / (r['output_bytes_slice'] / 2**20):.2f} | "
            f"{r['decode_rss_mib']} | {r['decode_tps']:.2f} ({r['decode_vs_dense']:.2f}x) | "
            f"{r['prefill_ms']:.0f} ({r['prefill_vs_dense']:.2f}x) | {r['gbps']:.2f}{of_read} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python benchmarks/real_size.py", description=__doc__.split("\n")[0])
    ap.add_argument("--work", default="/tmp/qo_real_size")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=32000, help="vocabulary of the runtime slice (sizes: 128256)")
    ap.add_argument("--rounds", type=int, default=2, help="A,B rounds per shape (best of)")
    ap.add_argument("--prefill", type=int, default=128)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--only", default=",".join(SCHEMES))
    ap.add_argument("--keep", action="store_true", help="keep the exports and outputs")
    ap.add_argument("--run_folded", action="store_true",
                    help="also load compact outputs whose ops the library has no kernel for (memory: see --help)")
    a = ap.parse_args(argv)
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    read = plain_read_gbs()
    print(f"plain memory read: {read['read_1t_GBs']} GB/s (1 thread), {read['read_2t_GBs']} GB/s (2 threads)",
          flush=True)
    rows = []
    for scheme in a.only.split(","):
        release = SCHEMES[scheme][2]
        export = write_export(work / f"{scheme}_export", scheme, a.layers, a.vocab)
        ex_split = _split_bytes(list(export_items(export)), a.vocab)
        forms = {"compact": (work / f"{scheme}_compact", [COMPACT_OPTION[SCHEMES[scheme][0]]]),
                 "fp32-dense (custom_ops_library=none)": (work / f"{scheme}_dense", ["custom_ops_library=none"])}
        info = {form: convert(export, out, extra) for form, (out, extra) in forms.items()}
        runs = {form: [] for form in forms}
        folded = {form: [op for op, how in kernels_used(out).items() if how != "kernel"]
                  for form, (out, _) in forms.items()}
        for _ in range(a.rounds):  # interleaved: A, B, A, B
            for form, (out, _) in forms.items():
                if folded[form] and not a.run_folded:  # the function fallback: ORT folds it to fp32 at load
                    runs[form].append({"error": f"not run: the library has no {'/'.join(folded[form])} kernel; its "
                                                "function is folded to fp32 at load (peak about 2x the dense form "
                                                "for FP8, out of memory for NVFP4; --run_folded runs it)"})
                    continue
                runs[form].append(run_child(out, a.prefill, a.tokens))
        load = os.getloadavg()[0]
        dense = None
        for form, (out, _) in forms.items():
            ok = [r for r in runs[form] if "error" not in r]
            if not ok:
                items = list(output_items(out))
                out_split = _split_bytes(items, a.vocab)
                out_split["other"] += sum(f.stat().st_size for f in out.iterdir() if f.is_file()
                                          and not f.name.startswith("tokenizer")) - sum(s for _, _, s in items)
                full = full_bytes(out_split, a.vocab) / 1e9
                rows.append({"release": release, "scheme": scheme, "form": form, "error": runs[form][0]["error"],
                             "output_gb_full": full, "export_gb_full": full_bytes(ex_split, a.vocab) / 1e9,
                             "ratio_to_export": full / (full_bytes(ex_split, a.vocab) / 1e9), **info[form],
                             "kernels": kernels_used(out)})
                continue
            best = {"decode_tps": max(r["decode_tps"] for r in ok), "prefill_ms": min(r["prefill_ms"] for r in ok),
                    "load_rss_mib": min(r["load_rss_mib"] for r in ok),
                    "decode_rss_mib": min(r["decode_rss_mib"] for r in ok), "load_s": min(r["load_s"] for r in ok)}
            items = list(output_items(out))
            out_split = _split_bytes(items, a.vocab)
            graph_etc = sum(f.stat().st_size for f in out.iterdir() if f.is_file()
                            and not f.name.startswith("tokenizer")) - sum(s for _, _, s in items)
            out_split["other"] += graph_etc
            streamed = session_weight_bytes(out)["streamed_bytes_per_token"]
            info[form]["kernels"] = kernels_used(out)
            row = {"release": release, "scheme": scheme, "form": form, **best, **info[form],
                   "runs": runs[form], "export_gb_full": full_bytes(ex_split, a.vocab) / 1e9,
                   "output_gb_full": full_bytes(out_split, a.vocab) / 1e9,
                   "output_bytes_slice": sum(s for _, _, s in items) + graph_etc,
                   "streamed_bytes_per_token_slice": streamed, "gbps": streamed * best["decode_tps"] / 1e9,
                   "load_avg_1min": load, "layers": a.layers, "vocab_slice": a.vocab}
            row["ratio_to_export"] = row["output_gb_full"] / row["export_gb_full"]
            row["read_GBs"], row["gbps_of_read"] = read, row["gbps"] / read["read_2t_GBs"]  # updated at the end
            if form.startswith("fp32"):
                dense = row
            rows.append(row)
        for row in rows:
            if row.get("scheme") == scheme and "error" not in row and dense:
                row["decode_vs_dense"] = row["decode_tps"] / dense["decode_tps"]
                row["prefill_vs_dense"] = row["prefill_ms"] / dense["prefill_ms"]
        print(table([r for r in rows if r.get("scheme") == scheme or r["release"] == release]), flush=True)
        _save(rows, argv)
        if not a.keep:
            for out, _ in forms.values():
                shutil.rmtree(out, ignore_errors=True)
            shutil.rmtree(export, ignore_errors=True)
    after = plain_read_gbs()
    best = {k: max(v, after[k]) for k, v in read.items()}
    for row in rows:
        if "gbps" in row:  # og runs on every core (ORT's default intra-op pool): against the all-thread read
            row["read_GBs"], row["gbps_of_read"] = best, row["gbps"] / best["read_2t_GBs"]
    print(f"plain memory read: {best} (best of before {read} and after {after})")
    _save(rows, argv, best)
    print(table(rows))
    return 0


def plain_read_gbs() -> dict[str, float]:
    """The machine's plain memory-read bandwidth, measured in this run: a C loop summing a 1 GiB float32 buffer
    (32x the 32 MiB L3) with 1 and 2 threads, best of 5 (benchmarks/custom_ops_cpu.py memory_read_gbs)."""
    from custom_ops_cpu import memory_read_gbs
    return memory_read_gbs(mib=1024, tries=5)


def _save(rows: list[dict], argv, read: dict | None = None) -> None:
    """Write the table and JSON; rows of other shapes already in the JSON (an earlier --only run) are kept."""
    results = REPO / "benchmarks" / "results"
    results.mkdir(exist_ok=True)
    old = results / "real_size.json"
    if old.exists():
        mine = {r.get("scheme") for r in rows}
        rows = [r for r in json.loads(old.read_text())["rows"] if r.get("scheme") not in mine] + rows
    meta = {"command": "python benchmarks/real_size.py " + " ".join(argv if argv is not None else sys.argv[1:]),
            "machine": {"cpus": os.cpu_count(), "load_avg_end": os.getloadavg(), "plain_read_GBs": read},
            "note": "sizes extrapolated to 32 layers and a 128256 vocabulary; speed and RSS measured on the slice"}
    (results / "real_size.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    (results / "real_size.md").write_text(f"`{meta['command']}`\n\n{table(rows)}\n")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_child":
        print(json.dumps(child_run(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))))
        raise SystemExit(0)
    raise SystemExit(main())
