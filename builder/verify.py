"""How close is a built ONNX model to PyTorch? ``python -m builder verify ONNX_DIR --reference DIR``.

The ONNX side runs through onnxruntime-genai (og.Model / og.Generator), i.e. the same runtime path,
genai_config.json, KV cache and custom-op settings that users get:
- full-sequence logits: one ``append_tokens`` call on the evaluation text, then
  ``generator.get_output("logits")`` ([1, T, vocab] after a prompt chunk);
- greedy decoding: ``generate_next_token`` with ``do_sample=False``.

The PyTorch side is one or two references:
- "quark": the Quark hf_format export loaded by transformers ``from_pretrained`` (transformers routes
  ``quant_method: "quark"`` to amd-quark, which emulates the quantized layers: QParamsLinear). This is the
  reference that isolates conversion error. It is skipped, with the reason, when loading leaves tensors
  missing / unexpected (amd-quark 0.13 + transformers 5.24: nvfp4 and fake_quantized exports) or gives
  non-finite logits;
- "float": the float model (``--float_reference``, or the ``source_model`` recorded by
  scripts/quantize_quark.py in quark_pipeline_info.json, or ``--reference`` itself when it is not quantized).
  It shows the total quantization + conversion error.

Metrics: perplexity on a text (default: the built-in text of builder.calib_text), max / mean |logit
difference| and top-1 agreement on that text (teacher forced), and greedy agreement over N new tokens
for a few prompts. torch and transformers are imported lazily, inside the functions that need them.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

from builder import calib_text

PIPELINE_INFO_FILE = "quark_pipeline_info.json"


class VerifyError(ValueError):
    """Bad verify input; printed as one line, exit code 2."""


# ---------------------------------------------------------------- ONNX side (onnxruntime-genai)

def load_onnx_model(onnx_dir: str, provider: str | None):
    import onnxruntime_genai as og

    if not (Path(onnx_dir) / "genai_config.json").is_file():
        raise VerifyError(f"{onnx_dir}: no genai_config.json (not an onnxruntime-genai model folder)")
    config = og.Config(onnx_dir)
    if provider:  # e.g. run a model built for another EP on CPU
        config.clear_providers()
        if provider != "cpu":
            config.append_provider(provider)
    return og.Model(config)


def onnx_sequence_logits(og_model, token_ids: np.ndarray) -> np.ndarray:
    """[T, vocab] float32 logits of token_ids, teacher forced: one forward pass over them (prompt processing), or,
    for an output whose logits are the last position's only (prefill_logits=last, the cpu default), one token at a
    time through the KV cache, each step's logits being that position's."""
    import onnxruntime_genai as og

    params = og.GeneratorParams(og_model)
    params.set_search_options(max_length=int(token_ids.size) + 1, do_sample=False)
    generator = og.Generator(og_model, params)
    ids = token_ids.reshape(1, -1).astype(np.int32)
    generator.append_tokens(ids)
    logits = np.asarray(generator.get_output("logits"), dtype=np.float32)
    if logits.shape[1] == token_ids.size:
        return logits[0]
    if logits.shape[1] != 1:
        raise RuntimeError(f"onnxruntime-genai returned logits for {logits.shape[1]} of {token_ids.size} positions")
    generator = og.Generator(og_model, params)  # pruned logits: the same positions, one decode step each
    rows = []
    for t in range(ids.shape[1]):
        generator.append_tokens(ids[:, t:t + 1])
        rows.append(np.asarray(generator.get_output("logits"), dtype=np.float32).reshape(-1))
    return np.stack(rows)


def onnx_greedy(og_model, prompt_ids: np.ndarray, new_tokens: int) -> list[int]:
    """Up to new_tokens greedy tokens (fewer when the model emits EOS)."""
    import onnxruntime_genai as og

    params = og.GeneratorParams(og_model)
    params.set_search_options(max_length=int(prompt_ids.size) + new_tokens, do_sample=False)
    generator = og.Generator(og_model, params)
    generator.append_tokens(prompt_ids.reshape(1, -1).astype(np.int32))
    produced = []
    while not generator.is_done() and len(produced) < new_tokens:
        generator.generate_next_token()
        produced.append(int(generator.get_next_tokens()[0]))
    return produced


# ---------------------------------------------------------------- PyTorch side (lazy torch)

def _loading_problems(loading_info: dict) -> list[str]:
    problems = []
    for key in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
        entries = list(loading_info.get(key) or [])
        if entries:
            problems.append(f"{len(entries)} {key.replace('_', ' ')} (e.g. {entries[0]})")
    return problems


def _quiet_libraries() -> None:
    """transformers' load report / progress bars and Quark's INFO lines would bury the table."""
    import os

    os.environ.setdefault("QUARK_LOG_LEVEL", "warning")
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def load_torch_model(model_dir: str):
    """(model, None) or (None, reason). A Quark export loads through transformers' quark quantizer."""
    _quiet_libraries()
    import torch
    from transformers import AutoModelForCausalLM

    try:
        model, loading_info = AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=torch.float32, output_loading_info=True
        )
    except Exception as exc:  # transformers raises on shape mismatches; quark may be missing
        first_line = (str(exc).strip().splitlines() or [""])[0][:200]
        return None, f"from_pretrained failed: {type(exc).__name__}: {first_line}"
    problems = _loading_problems(loading_info)
    if problems:
        return None, "from_pretrained left tensors unloaded: " + "; ".join(problems)
    return model.eval(), None


def torch_sequence_logits(model, token_ids: np.ndarray) -> np.ndarray:
    import torch

    with torch.no_grad():
        logits = model(torch.from_numpy(token_ids.astype(np.int64)).reshape(1, -1)).logits
    return logits[0].float().numpy()


def torch_greedy(model, prompt_ids: np.ndarray, new_tokens: int) -> list[int]:
    """Exactly new_tokens argmax tokens, with the model's own KV cache; EOS does not stop it."""
    import inspect

    import torch

    # transformers 5.x renamed past_key_values -> cache (the old name still works, with a warning).
    cache_name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    produced = []
    with torch.no_grad():
        output = model(torch.from_numpy(prompt_ids.astype(np.int64)).reshape(1, -1), use_cache=True)
        for _ in range(new_tokens):
            next_token = int(output.logits[0, -1].argmax())
            produced.append(next_token)
            output = model(torch.tensor([[next_token]]), use_cache=True, **{cache_name: getattr(output, cache_name)})
    return produced


# ---------------------------------------------------------------- metrics

def perplexity(logits: np.ndarray, token_ids: np.ndarray) -> float:
    """exp(mean NLL of token t+1 given logits at t), in float64."""
    logits64 = logits[:-1].astype(np.float64)
    shifted = logits64 - logits64.max(axis=-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    nll = -log_probs[np.arange(token_ids.size - 1), token_ids[1:]]
    return float(math.exp(nll.mean()))


def compare_logits(onnx_logits: np.ndarray, reference_logits: np.ndarray) -> dict:
    difference = np.abs(onnx_logits.astype(np.float64) - reference_logits.astype(np.float64))
    return dict(
        max_abs_logit_diff=float(difference.max()),
        mean_abs_logit_diff=float(difference.mean()),
        top1_agreement=float((onnx_logits.argmax(-1) == reference_logits.argmax(-1)).mean()),
        reference_logit_range=float(np.abs(reference_logits).max()),
    )


def greedy_agreement(onnx_tokens: list[list[int]], reference_tokens: list[list[int]]) -> dict:
    """Position-wise matches over the tokens ONNX produced, and the first divergence per prompt."""
    matched = compared = 0
    first_divergence = []
    for produced, expected in zip(onnx_tokens, reference_tokens):
        pairs = list(zip(produced, expected))
        matched += sum(a == b for a, b in pairs)
        compared += len(pairs)
        first_divergence.append(next((i for i, (a, b) in enumerate(pairs) if a != b), None))
    return dict(greedy_matched=matched, greedy_compared=compared,
                greedy_agreement=matched / compared if compared else float("nan"),
                first_divergence=first_divergence)


# ---------------------------------------------------------------- inputs

def _read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def find_references(reference: str, float_reference: str | None) -> dict[str, str]:
    """{"quark": dir, "float": dir} for what can be compared against."""
    reference_dir = Path(reference)
    config = _read_json(reference_dir / "config.json")
    if not config:
        raise VerifyError(f"--reference '{reference}' has no config.json (need a local HF float or Quark export folder)")
    references = {}
    quant_method = (config.get("quantization_config") or {}).get("quant_method")
    if quant_method == "quark":
        references["quark"] = str(reference_dir)
        source = float_reference or _read_json(reference_dir / PIPELINE_INFO_FILE).get("source_model")
        if source and Path(source, "config.json").is_file():
            references["float"] = str(source)
    elif quant_method:
        raise VerifyError(f"--reference '{reference}': quant_method '{quant_method}' is not a Quark export")
    else:
        references["float"] = str(reference_dir)
    if float_reference and "float" not in references:
        raise VerifyError(f"--float_reference '{float_reference}' has no config.json")
    return references


def make_tokenizer(og_model, reference_dirs: list[str]):
    """encode(str) -> np.int32 ids: the ONNX folder's tokenizer, else the reference's, else None."""
    try:
        import onnxruntime_genai as og

        og_tokenizer = og.Tokenizer(og_model)
        og_tokenizer.encode("probe")
        return lambda text: np.asarray(og_tokenizer.encode(text), dtype=np.int32)
    except Exception:
        pass
    for directory in reference_dirs:
        try:
            from transformers import AutoTokenizer

            hf_tokenizer = AutoTokenizer.from_pretrained(directory)
            return lambda text: np.asarray(hf_tokenizer(text)["input_ids"], dtype=np.int32)
        except Exception:
            continue
    return None


def evaluation_inputs(tokenize, text: str | None, prompts, vocab_size: int, max_tokens: int):
    if tokenize is None:
        print("warning: no tokenizer in the ONNX or reference folder; evaluating on random token ids", flush=True)
        generator = np.random.default_rng(0)
        text_ids = generator.integers(3, vocab_size, size=max_tokens, dtype=np.int32)
        prompt_ids = [generator.integers(3, vocab_size, size=8, dtype=np.int32) for _ in range(3)]
        return text_ids, prompt_ids
    try:
        full_text = "\n\n".join(calib_text.load_texts(text))
    except calib_text.DatasetSourceError as exc:
        raise VerifyError(str(exc)) from None
    text_ids = tokenize(full_text)[:max_tokens]
    prompt_ids = [tokenize(p) for p in (prompts or calib_text.DEFAULT_PROMPTS)]
    if text_ids.size < 2 or any(p.size == 0 for p in prompt_ids):
        raise VerifyError("evaluation text needs at least 2 tokens and every prompt at least 1")
    return text_ids, prompt_ids


# ---------------------------------------------------------------- driver

def run_verify(onnx_dir: str, reference: str, *, float_reference: str | None = None, text: str | None = None,
               prompts: list[str] | None = None, new_tokens: int = 16, max_tokens: int = 256,
               provider: str | None = None, json_out: str | None = None, print_table: bool = False) -> dict:
    """Compare an ONNX model folder with PyTorch references. Returns the figures as a dict (also JSON-able)."""
    references = find_references(reference, float_reference)
    og_model = load_onnx_model(onnx_dir, provider)
    genai_config = _read_json(Path(onnx_dir) / "genai_config.json").get("model", {})
    context_length = int(genai_config.get("context_length") or max_tokens + new_tokens)
    vocab_size = int(genai_config.get("vocab_size") or 256)
    tokenize = make_tokenizer(og_model, [onnx_dir, *references.values()])
    text_ids, prompt_ids = evaluation_inputs(tokenize, text, prompts, vocab_size,
                                             min(max_tokens, context_length - 1))
    prompt_ids = [p[: max(1, context_length - new_tokens)] for p in prompt_ids]

    onnx_logits = onnx_sequence_logits(og_model, text_ids)
    onnx_tokens = [onnx_greedy(og_model, p, new_tokens) for p in prompt_ids]
    result = dict(onnx_dir=str(onnx_dir), tokens_evaluated=int(text_ids.size), new_tokens=new_tokens,
                  prompts=len(prompt_ids), onnx=dict(perplexity=perplexity(onnx_logits, text_ids),
                                                     greedy_tokens=onnx_tokens,
                                                     accuracy_level=built_accuracy_level(onnx_dir)),
                  references={})
    for name, directory in references.items():
        model, reason = load_torch_model(directory)
        if model is not None:
            reference_logits = torch_sequence_logits(model, text_ids)
            if not np.isfinite(reference_logits).all():
                model, reason = None, "PyTorch logits are not finite"
        if model is None:
            result["references"][name] = dict(path=directory, skipped=reason)
            continue
        reference_tokens = [torch_greedy(model, p, new_tokens) for p in prompt_ids]
        result["references"][name] = dict(
            path=directory, perplexity=perplexity(reference_logits, text_ids),
            **compare_logits(onnx_logits, reference_logits),
            **greedy_agreement(onnx_tokens, reference_tokens),
        )
        del model
    if print_table:
        print(format_table(result))
    if json_out:
        Path(json_out).write_text(json.dumps(result, indent=1))
    return result


def built_accuracy_level(onnx_dir: str) -> str:
    """The MatMulNBits accuracy_level the model was built with (model metadata written by the converter), or
    "unknown" for a model built elsewhere."""
    import onnx

    path = Path(onnx_dir) / "model.onnx"
    if not path.is_file():
        return "unknown"
    props = {p.key: p.value for p in onnx.load(str(path), load_external_data=False).metadata_props}
    return props.get("quark_onnx.accuracy_level", "unknown")


def format_table(result: dict) -> str:
    columns = ["onnx"] + [f"torch {name}" for name in result["references"]]
    rows = [("perplexity", [result["onnx"]["perplexity"]] + [r.get("perplexity") for r in result["references"].values()])]
    for key, label in (("max_abs_logit_diff", "max |logit diff|"), ("mean_abs_logit_diff", "mean |logit diff|"),
                       ("top1_agreement", "top-1 agreement"), ("greedy_agreement", "greedy agreement")):
        rows.append((label, [None] + [r.get(key) for r in result["references"].values()]))

    def cell(value, key):
        if value is None:
            return "-"
        if "agreement" in key:
            return f"{100 * value:.1f}%"
        return f"{value:.4g}"

    level = result["onnx"].get("accuracy_level", "unknown")
    level_note = {"none": "none (no MatMulNBits)", "unknown": "unknown (no quark_onnx metadata)"}.get(level, level)
    lines = [f"{result['tokens_evaluated']} text tokens, {result['prompts']} prompts x {result['new_tokens']} new tokens",
             f"built with MatMulNBits accuracy_level: {level_note}",
             f"{'':20}" + "".join(f"{c:>16}" for c in columns)]
    lines += [f"{label:20}" + "".join(f"{cell(v, label):>16}" for v in values) for label, values in rows]
    lines += [f"torch {name}: skipped ({r['skipped']})" for name, r in result["references"].items() if "skipped" in r]
    return "\n".join(lines)


def main(argv=None, parser: argparse.ArgumentParser | None = None) -> int:
    """`parser`: the CLI's (prog, description and example set by builder/__main__.py)."""
    parser = parser or argparse.ArgumentParser(prog="python -m builder verify",
                                               description="Compare an ONNX model with PyTorch (float and "
                                                           "Quark-emulated).")
    parser.add_argument("onnx_dir", help="folder with genai_config.json + model.onnx")
    parser.add_argument("--reference", required=True, help="Quark hf_format export or float HF model folder")
    parser.add_argument("--float_reference", default=None, help="float HF model folder (when --reference is a Quark export)")
    parser.add_argument("--text", default=None, help="text file for perplexity (.txt/.jsonl); default: built-in text")
    parser.add_argument("--prompts", nargs="+", default=None, help="prompts for greedy agreement")
    parser.add_argument("--new_tokens", type=int, default=16)
    parser.add_argument("--max_tokens", type=int, default=256, help="text tokens evaluated (capped by context length)")
    parser.add_argument("--provider", default=None, help="override the genai_config provider (e.g. cpu)")
    parser.add_argument("--json", dest="json_out", default=None, help="write the figures to this JSON file")
    parser.add_argument("--verbose", action="store_true", help="show tracebacks")
    args = parser.parse_args(argv)
    try:
        run_verify(args.onnx_dir, args.reference, float_reference=args.float_reference, text=args.text,
                   prompts=args.prompts, new_tokens=args.new_tokens, max_tokens=args.max_tokens,
                   provider=args.provider, json_out=args.json_out, print_table=True)
    except VerifyError as exc:
        from .cli_text import MAX_LINE, clip
        print(clip(f"error: {exc}", MAX_LINE), file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
