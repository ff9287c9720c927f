"""Llama-3 shapes (vocab 128256): this builder vs the onnxruntime-genai 0.18 builder on the same synthetic export.

    python benchmarks/llama3_vs_genai.py --shape llama3-1b --work DIR [--anchor] [--variants float,int8,bf16,bf16all,fp16]
                                          [--convert_rounds 2] [--decode_rounds 2] [--json OUT] [--table OUT.md]

For one shape (benchmarks/synthetic_quark_export.py presets llama3-1b / llama3-8b / llama3-70b-sliced) it
- writes the export into DIR (once; kept for reruns) with tokenizer files the genai builder needs;
- converts it with this builder (`float`: the default exact float lm_head/embedding; `int8`: --extra_options
  lm_head=int8; `bf16`: --extra_options lm_head=bf16 with the custom-op library; `bf16all`: that plus
  embedding=bf16; `fp16`: -p fp16, fp16 storage of
  every float tensor and fp16 activations) and, with --anchor, with
  `python -m onnxruntime_genai.models.builder -p int4 -e cpu` plus the flags that keep the float lm_head/embedding
  exact (shared_embeddings=false, nodes_to_exclude=/lm_head/MatMul,/model/embed_tokens/Gather, accuracy_level=4),
  each in a fresh process under /usr/bin/time -v (wall, peak RSS);
- measures the I/O floor right after each ours-float conversion, in the same state: reading every input file and
  writing a file the size of our output in 16 MiB pwrites, in the output's file system. Every timed step starts with
  the dirty pages flushed (sync); with --controlled also with the page cache dropped and the export read back in
  (warm input, free memory), because on a VM the cost of page-cache writes depends on what memory holds. With
  --convert_rounds N every variant is converted N times, interleaved with the floors; medians are reported, and the
  ratio of each conversion to its adjacent floor;
- with --decode_rounds N: decode tokens/s and prefill ms of every output, each measurement a fresh process, the
  outputs interleaved A/B/C/A/B/C so machine noise hits all of them; best of the rounds is reported;
- the max |logit difference| of each output against ours-float on one prompt (ORT CPU, empty KV cache), and the
  perplexity each gives a fixed random token sequence (teacher forced): the change is the fidelity cost of int8.
Big outputs are deleted unless --keep. Synthetic random weights: speed and memory, not accuracy.
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

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
ANCHOR_FLAGS = ["--extra_options", "shared_embeddings=false",
                "nodes_to_exclude=/lm_head/MatMul,/model/embed_tokens/Gather", "accuracy_level=4"]


def timed(cmd: list[str], cwd: Path, log: Path) -> dict:
    """Run under /usr/bin/time -v; wall seconds and peak RSS (MiB) from its report."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONPATH=str(REPO))
    t0 = time.perf_counter()
    with open(log, "w") as fh:
        rc = subprocess.call(["/usr/bin/time", "-v", *cmd], cwd=cwd, stdout=fh, stderr=subprocess.STDOUT, env=env)
    wall = time.perf_counter() - t0
    text = log.read_text(errors="replace")
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", text)
    cpu = re.search(r"Percent of CPU this job got: (\d+)%", text)
    return {"rc": rc, "wall_s": round(wall, 1), "peak_rss_mib": round(int(rss.group(1)) / 1024) if rss else None,
            "cpu_percent": int(cpu.group(1)) if cpu else None, "log": log.name}  # relative to --work


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def read_floor(folder: Path) -> float:
    buf = bytearray(16 << 20)
    t = time.perf_counter()
    for f in sorted(folder.iterdir()):
        if f.is_file():
            with open(f, "rb", buffering=0) as fh:
                while fh.readinto(buf):
                    pass
    return time.perf_counter() - t


def variant_flags(v: str) -> list[str]:
    """Builder flags of one of our variants. bf16 needs the custom-op library (`python -m custom_ops.ort_library`)."""
    if v == "float":
        return []
    if v == "fp16":
        return ["-p", "fp16"]
    if v in ("bf16", "bf16all"):  # bf16all: the embedding too (a tied lm_head then shares its one bf16 table)
        from custom_ops.ort_library import library_path
        return ["--extra_options", "lm_head=bf16", f"custom_ops_library={library_path()}",
                *(["embedding=bf16"] if v == "bf16all" else [])]
    return ["--extra_options", f"lm_head={v}"]


def median(values: list[float]) -> float:
    v = sorted(values)
    return round((v[(len(v) - 1) // 2] + v[len(v) // 2]) / 2, 2)


def settle(export: Path, controlled: bool) -> None:
    """Before a timed step: dirty pages flushed; with --controlled also the page cache dropped (root only) and the
    export read back in, so every step starts with the input warm and the rest of memory free."""
    os.sync()
    if controlled:
        try:
            Path("/proc/sys/vm/drop_caches").write_text("3\n")
        except OSError as exc:
            print(f"--controlled: cannot drop the page cache ({exc}); input warmed only", file=sys.stderr)
        read_floor(export)


def io_floor(export: Path, work: Path, nbytes: int) -> dict:
    """Read every input file, then write `nbytes` (our output's size) in the output's file system."""
    read_s = read_floor(export)
    os.sync()
    return {"read_s": round(read_s, 1), "write_s": round(write_floor(work / "floor.bin", nbytes), 1),
            "bytes": nbytes}


def write_floor(path: Path, nbytes: int) -> float:
    block = np.random.default_rng(0).integers(0, 256, 16 << 20, dtype=np.uint8).tobytes()
    t = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        done = 0
        while done < nbytes:
            n = min(len(block), nbytes - done)
            done += os.pwrite(fd, block[:n], done)
    finally:
        os.close(fd)
    dt = time.perf_counter() - t
    path.unlink()
    return dt


# ---- child modes (each run in a fresh process) -----------------------------------------------------------------
def child_decode(model_dir: str, prompt_len: int, tokens: int, prefill_len: int) -> dict:
    import onnxruntime_genai as og
    model = og.Model(model_dir)
    vocab = json.loads((Path(model_dir) / "genai_config.json").read_text())["model"]["vocab_size"]
    rng = np.random.default_rng(0)
    out = {}
    # prefill: one append_tokens of prefill_len tokens (the whole prompt in one run)
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=prefill_len + 2, min_length=0)
    gen = og.Generator(model, params)
    ids = rng.integers(3, vocab, size=(1, prefill_len), dtype=np.int32)
    gen.append_tokens(ids[:, :8])  # warm-up of the kernels (first run prepacks weights)
    gen = og.Generator(model, params)
    t = time.perf_counter()
    gen.append_tokens(ids)
    out["prefill_ms"] = round((time.perf_counter() - t) * 1e3, 1)
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=prompt_len + tokens, min_length=0)
    gen = og.Generator(model, params)
    gen.append_tokens(rng.integers(3, vocab, size=(1, prompt_len), dtype=np.int32))
    gen.generate_next_token()
    t, n = time.perf_counter(), 0
    while not gen.is_done():
        gen.generate_next_token()
        n += 1
    out["decode_tps"] = round(n / (time.perf_counter() - t), 2)
    with open("/proc/self/status") as fh:
        out["decode_rss_mib"] = round(int(re.search(r"VmHWM:\s+(\d+)", fh.read()).group(1)) / 1024)
    return out


def child_logits(model_dir: str, npz: str, seq_len: int) -> dict:
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.log_severity_level = 3
    cfg = json.loads((Path(model_dir) / "genai_config.json").read_text())["model"]
    library = cfg["decoder"].get("session_options", {}).get("custom_ops_library")
    if library:  # bundled next to the model (lm_head=bf16): the kernel, as og.Model runs it
        so.register_custom_ops_library(str(Path(model_dir) / library))
    sess = ort.InferenceSession(str(Path(model_dir) / "model.onnx"), so, providers=["CPUExecutionProvider"])
    vocab, dec = cfg["vocab_size"], cfg["decoder"]
    ids = np.random.default_rng(1).integers(3, vocab, size=(1, seq_len), dtype=np.int64)
    feeds = {}
    for inp in sess.get_inputs():
        if inp.name == "input_ids":
            feeds[inp.name] = ids.astype(np.int64 if "int64" in inp.type else np.int32)
        elif inp.name == "attention_mask":
            feeds[inp.name] = np.ones_like(ids, dtype=np.int64 if "int64" in inp.type else np.int32)
        elif inp.name == "position_ids":
            feeds[inp.name] = np.arange(seq_len, dtype=np.int64)[None]
        elif inp.name.startswith("past_key_values"):
            dtype = np.float16 if "float16" in inp.type else np.float32
            feeds[inp.name] = np.zeros((1, dec["num_key_value_heads"], 0, dec["head_size"]), dtype=dtype)
    logits = sess.run(["logits"], feeds)[0].astype(np.float32)[0]
    np.savez(npz, logits=logits, ids=ids[0])
    return {}


def child_main(argv: list[str]) -> int:
    mode, *rest = argv
    if mode == "_decode":
        print(json.dumps(child_decode(rest[0], int(rest[1]), int(rest[2]), int(rest[3]))))
    else:
        print(json.dumps(child_logits(rest[0], rest[1], int(rest[2]))))
    return 0


def run_child(args: list[str]) -> dict:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    r = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, env=env)
    if r.returncode:
        return {"error": (r.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(r.stdout.strip().splitlines()[-1])


def ppl(logits: np.ndarray, ids: np.ndarray) -> float:
    """exp(mean NLL) of ids[1:] under logits[:-1] (teacher forced)."""
    x = logits[:-1].astype(np.float64)
    x -= x.max(axis=1, keepdims=True)
    logp = x - np.log(np.exp(x).sum(axis=1, keepdims=True))
    return float(np.exp(-logp[np.arange(len(ids) - 1), ids[1:]].mean()))


# ---- main ------------------------------------------------------------------------------------------------------
def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1].startswith("_"):
        return child_main(sys.argv[1:])
    from synthetic_quark_export import PRESETS, write
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", required=True, choices=sorted(PRESETS))
    ap.add_argument("--work", required=True, help="scratch folder for the export and the outputs")
    ap.add_argument("--anchor", action="store_true", help="also run the onnxruntime-genai builder")
    ap.add_argument("--variants", default="float,int8",
                    help="ours: float (default lm_head), int8 (lm_head=int8), bf16 (lm_head=bf16 + the custom-op "
                         "library), bf16all (bf16 + embedding=bf16), fp16 (-p fp16)")
    ap.add_argument("--convert_rounds", type=int, default=1)
    ap.add_argument("--controlled", action="store_true",
                    help="drop the page cache and re-read the export before every timed step (needs root)")
    ap.add_argument("--decode_rounds", type=int, default=0)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--prompt_len", type=int, default=16)
    ap.add_argument("--prefill_len", type=int, default=128)
    ap.add_argument("--logits", action="store_true", help="max logit difference and ppl of each output")
    ap.add_argument("--keep", action="store_true", help="keep the converted outputs")
    ap.add_argument("--json", default=None)
    ap.add_argument("--table", default=None)
    a = ap.parse_args()
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    export = work / f"export-{a.shape}"
    if not (export / "config.json").exists():
        write(export, a.shape, tokenizer_from=str(REPO / "examples" / "tiny-llama-float"))
    res: dict = {"shape": a.shape, "export_bytes": folder_bytes(export), "machine": machine(), "outputs": {}}
    outs: dict[str, Path] = {}
    variants = [v for v in a.variants.split(",") if v]
    floors = []
    for rnd in range(max(1, a.convert_rounds)):
        for v in variants:
            out = work / f"ours-{v}-{a.shape}"
            shutil.rmtree(out, ignore_errors=True)
            extra = variant_flags(v)
            settle(export, a.controlled)
            r = timed([sys.executable, "-m", "builder", "-i", str(export), "-o", str(out), "-e", "cpu", *extra],
                      REPO, work / f"ours-{v}-{rnd}.log")
            r["output_bytes"] = folder_bytes(out) if out.exists() else None
            res["outputs"].setdefault(f"ours-{v}", {"convert_rounds": []})["convert_rounds"].append(r)
            outs[f"ours-{v}"] = out
            print(f"convert round {rnd} ours-{v}: {r}", flush=True)
            if v == "float" and r["output_bytes"]:  # the floor right after, in the same state
                settle(export, a.controlled)
                floors.append(io_floor(export, work, r["output_bytes"]))
                print(f"convert round {rnd} I/O floor: {floors[-1]}", flush=True)
    for v in variants:
        rounds = res["outputs"][f"ours-{v}"]["convert_rounds"]
        res["outputs"][f"ours-{v}"].update({k: rounds[-1][k] for k in ("rc", "output_bytes")})
        res["outputs"][f"ours-{v}"]["wall_s"] = median([r["wall_s"] for r in rounds])
        res["outputs"][f"ours-{v}"]["peak_rss_mib"] = max(r["peak_rss_mib"] or 0 for r in rounds)
        res["outputs"][f"ours-{v}"]["cpu_percent"] = median([r["cpu_percent"] or 0 for r in rounds])
    if floors:
        res["io_floor_runs"] = floors
        res["read_floor_s"] = median([f["read_s"] for f in floors])
        res["write_floor_s"] = median([f["write_s"] for f in floors])
        res["io_floor_s"] = median([f["read_s"] + f["write_s"] for f in floors])
        pairs = [r["wall_s"] / (f["read_s"] + f["write_s"])
                 for r, f in zip(res["outputs"]["ours-float"]["convert_rounds"], floors)]
        res["outputs"]["ours-float"]["convert_over_adjacent_floor"] = [round(x, 2) for x in pairs]
        for v in variants:
            r = res["outputs"][f"ours-{v}"]
            r["convert_over_io_floor"] = round(r["wall_s"] / max(res["io_floor_s"], 1e-3), 2)
    if a.anchor:
        out = work / f"anchor-{a.shape}"
        shutil.rmtree(out, ignore_errors=True)
        settle(export, a.controlled)
        r = timed([sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(export), "-o", str(out), "-p",
                   "int4", "-e", "cpu", "-c", str(work / "anchor-cache"), *ANCHOR_FLAGS], work, work / "anchor.log")
        shutil.rmtree(work / "anchor-cache", ignore_errors=True)
        r["output_bytes"] = folder_bytes(out) if out.exists() else None
        res["outputs"]["anchor"], outs["anchor"] = r, out
    ready = {k: p for k, p in outs.items() if (p / "genai_config.json").exists()}
    for rnd in range(a.decode_rounds):
        for name, p in ready.items():
            m = run_child(["_decode", str(p), str(a.prompt_len), str(a.tokens), str(a.prefill_len)])
            res["outputs"][name].setdefault("decode_rounds", []).append(m)
            print(f"round {rnd} {name}: {m}", flush=True)
    for name in ready:
        rounds = [m for m in res["outputs"][name].get("decode_rounds", []) if "decode_tps" in m]
        if rounds:
            res["outputs"][name]["decode_tps"] = max(m["decode_tps"] for m in rounds)
            res["outputs"][name]["prefill_ms"] = min(m["prefill_ms"] for m in rounds)
            res["outputs"][name]["decode_rss_mib"] = max(m["decode_rss_mib"] for m in rounds)
    if a.logits and "ours-float" in ready:
        base = None
        for name, p in ready.items():
            npz = work / f"logits-{name}.npz"
            m = run_child(["_logits", str(p), str(npz), str(a.prefill_len)])
            if "error" in m:
                res["outputs"][name]["logits_error"] = m["error"]
                continue
            d = np.load(npz)
            if name == "ours-float":
                base = d["logits"]
            res["outputs"][name]["ppl_random_sequence"] = round(ppl(d["logits"], d["ids"]), 3)
            if base is not None:
                res["outputs"][name]["max_logit_diff_vs_ours_float"] = float(np.abs(d["logits"] - base).max())
                res["outputs"][name]["logit_std"] = float(d["logits"].std())
            npz.unlink()
    if not a.keep:
        for p in outs.values():
            shutil.rmtree(p, ignore_errors=True)
    text = table(res)
    print(text)
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))
    if a.table:
        Path(a.table).write_text(text + "\n")
    return 0


def machine() -> dict:
    load = os.getloadavg()
    mem = {}
    with open("/proc/meminfo") as fh:
        for line in fh:
            k, v = line.split(":")
            mem[k] = int(v.split()[0])
    return {"cpus": os.cpu_count(), "loadavg_at_start": [round(x, 2) for x in load],
            "mem_available_gib": round(mem.get("MemAvailable", 0) / 2**20, 1)}


def table(res: dict) -> str:
    floor = res.get("io_floor_s")
    rows = [f"shape {res['shape']}: export {res['export_bytes'] / 2**30:.2f} GiB; I/O floor {floor} s "
            f"(read {res.get('read_floor_s')} s + write {res.get('write_floor_s')} s)", "",
            "| output | convert s | x I/O floor | peak RSS MiB | CPU % | output GiB | decode tok/s | prefill ms | "
            "max logit diff vs ours-float | ppl (random seq.) |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, r in res["outputs"].items():
        out_gib = f"{r['output_bytes'] / 2**30:.2f}" if r.get("output_bytes") else "-"
        ratio = f"{r['wall_s'] / floor:.1f}" if floor else "-"
        diff = r.get("max_logit_diff_vs_ours_float")
        rows.append(f"| {name} | {r['wall_s']} | {ratio} | {r['peak_rss_mib']} | {r.get('cpu_percent')} | {out_gib} | "
                    f"{r.get('decode_tps', '-')} | {r.get('prefill_ms', '-')} | "
                    f"{'-' if diff is None else f'{diff:.3g}'} | {r.get('ppl_random_sequence', '-')} |")
    return "\n".join(rows)


if __name__ == "__main__":
    raise SystemExit(main())
