#!/usr/bin/env python3
"""Float Hugging Face model -> AMD Quark quantization -> hf_format export -> (optional) ONNX + verify.

    python scripts/quantize_quark.py --model_dir FLOAT_HF_DIR --output_dir QUARK_DIR \
        --quant_scheme w_uint4_per_group_asym --group_size 128 [--quant_algo awq] \
        [--onnx_out ONNX_DIR -e cpu]

Flag names follow Quark's examples/torch/language_modeling/llm_ptq/quantize_quark.py. Every check that
can fail cheaply (scheme, model folder, dataset, group size, algorithm, scheme/EP combination) runs
before torch and amd-quark are imported; such failures print one line and exit with code 2.
Needs the "quantize" extra: torch==2.13.0, amd-quark==0.13, transformers. Runs on CPU.
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:  # run as a plain script from a checkout
    sys.path.insert(0, str(REPO_ROOT))

from builder import calib_text  # noqa: E402  (torch-free)
from builder.cli_text import (MAX_LINE, clip, missing_package_text, require,  # noqa: E402
                              run_quietly_on_closed_pipe)

EXIT_USAGE = 2
EXIT_FAILED = 1
PIPELINE_INFO_FILE = "quark_pipeline_info.json"


class UsageError(Exception):
    """Bad input found before or during setup: printed as one line, exit code 2."""


@dataclass(frozen=True)
class SchemeSpec:
    """One user-facing scheme name and how it maps onto amd-quark 0.13's LLMTemplate schemes."""

    template: str  # LLMTemplate scheme name; "{g}" is replaced by the group size
    family: str  # uint4_group, int4_group, uint4_channel, int4_channel, int8, fp8, ptpc_fp8, mxfp4, nvfp4
    quantizes_activations: bool
    per_group: bool = False


# User-facing names: Quark <= 0.10 example names (w_..._a_...) and the 0.11+ template names.
SCHEMES: dict[str, SchemeSpec] = {
    "w_uint4_per_group_asym": SchemeSpec("uint4_wo_{g}", "uint4_group", False, per_group=True),
    "w_int4_per_group_sym": SchemeSpec("int4_wo_{g}", "int4_group", False, per_group=True),
    "w_uint4_per_channel_asym": SchemeSpec("uint4_wo_per_channel", "uint4_channel", False),
    "w_int4_per_channel_sym": SchemeSpec("int4_wo_per_channel", "int4_channel", False),
    "w_int8_a_int8_per_tensor_sym": SchemeSpec("int8", "int8", True),
    "w_fp8_a_fp8": SchemeSpec("fp8", "fp8", True),
    "w_fp8_per_channel_a_fp8_per_token": SchemeSpec("ptpc_fp8", "ptpc_fp8", True),
    "w_mxfp4_a_mxfp4": SchemeSpec("mxfp4", "mxfp4", True),
    "w_nvfp4_a_nvfp4": SchemeSpec("nvfp4", "nvfp4", True),
}
SCHEME_ALIASES = {
    "ptpc_fp8": "w_fp8_per_channel_a_fp8_per_token",
    "int8": "w_int8_a_int8_per_tensor_sym",
    "fp8": "w_fp8_a_fp8",
    "mxfp4": "w_mxfp4_a_mxfp4",
    "nvfp4": "w_nvfp4_a_nvfp4",
    "uint4_wo_per_channel": "w_uint4_per_channel_asym",
    "int4_wo_per_channel": "w_int4_per_channel_sym",
}
# Quark 0.11+ names with the group size inside: uint4_wo_32/64/128, int4_wo_32/64/128.
GROUP_TEMPLATE_PREFIXES = {"uint4_wo_": "w_uint4_per_group_asym", "int4_wo_": "w_int4_per_group_sym"}

ALGORITHMS = ("none", "rtn", "awq", "gptq", "smoothquant")
# Which scheme families each calibration algorithm is meant for (checked before quantization).
ALGORITHM_FAMILIES = {
    "awq": {"uint4_group", "int4_group", "uint4_channel", "int4_channel"},
    "gptq": {"uint4_group", "int4_group", "uint4_channel", "int4_channel"},
    "smoothquant": {"int8", "fp8", "ptpc_fp8"},
}

EXECUTION_PROVIDERS = ("cpu", "cuda", "rocm", "migraphx")
# (scheme family or "kv_fp8", EP) -> why the builder refuses it, checked before the slow quantization starts.
# Empty today: every scheme offered here converts for every EP (the FP8 KV cache is emulated where GQA has no
# FP8 cache; 8-bit weight-only, which MIGraphX cannot take, is not among the offered schemes).
REFUSED_COMBINATIONS: dict[tuple[str, str], str] = {}

TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model", "vocab.json",
    "merges.txt", "added_tokens.json", "chat_template.jinja", "chat_template.json", "generation_config.json",
)
SUPPORTED_MATMUL_GROUP_SIZES = (16, 32, 64, 128, 256)


def resolve_scheme(name: str) -> tuple[str, SchemeSpec, int | None]:
    """User scheme name -> (canonical name, spec, group size embedded in the name or None)."""
    if name in SCHEMES:
        return name, SCHEMES[name], None
    if name in SCHEME_ALIASES:
        canonical = SCHEME_ALIASES[name]
        return canonical, SCHEMES[canonical], None
    for prefix, canonical in GROUP_TEMPLATE_PREFIXES.items():
        if name.startswith(prefix) and name[len(prefix):].isdigit():
            return canonical, SCHEMES[canonical], int(name[len(prefix):])
    known = sorted(set(SCHEMES) | set(SCHEME_ALIASES)) + ["uint4_wo_<G>", "int4_wo_<G>"]
    raise UsageError(f"unknown --quant_scheme '{name}'; supported: {', '.join(known)}")


def template_scheme_name(spec: SchemeSpec, group_size: int) -> str:
    return spec.template.format(g=group_size)


def parse_layer_overrides(args, spec: SchemeSpec, group_size: int) -> dict[str, str]:
    """--layer_group_size PATTERN=N / --group_size_per_layer PATTERN N / --layer_quant_scheme PATTERN SCHEME."""
    overrides: dict[str, str] = {}
    pairs = [item.split("=", 1) for item in args.layer_group_size or []]
    pairs += [list(item) for item in args.group_size_per_layer or []]
    for pair in pairs:
        if len(pair) != 2 or not pair[0] or not pair[1].isdigit():
            raise UsageError(f"--layer_group_size expects PATTERN=GROUP_SIZE (e.g. lm_head=32), got '{'='.join(pair)}'")
        if not spec.per_group:
            raise UsageError(f"--layer_group_size {pair[0]}={pair[1]}: scheme '{args.quant_scheme}' has no group size")
        check_group_size(int(pair[1]), f"--layer_group_size {pair[0]}")
        overrides[pair[0]] = template_scheme_name(spec, int(pair[1]))
    for pattern, scheme_name in args.layer_quant_scheme or []:
        _, layer_spec, layer_group = resolve_scheme(scheme_name)
        overrides[pattern] = template_scheme_name(layer_spec, layer_group or group_size)
    return overrides


def check_group_size(group_size: int, flag: str) -> None:
    if group_size not in SUPPORTED_MATMUL_GROUP_SIZES:
        raise UsageError(
            f"{flag}: group size {group_size} not supported; use one of {SUPPORTED_MATMUL_GROUP_SIZES}"
            " (MatMulNBits needs a power of two >= 16)"
        )


def read_model_config(model_dir: Path) -> dict:
    if not model_dir.is_dir():
        raise UsageError(
            f"--model_dir '{model_dir}' is not a local folder (hub model ids cannot be downloaded here)"
        )
    config_path = model_dir / "config.json"
    if not config_path.is_file():
        raise UsageError(f"--model_dir '{model_dir}' has no config.json: not a Hugging Face model folder")
    config = json.loads(config_path.read_text())
    if config.get("quantization_config"):
        method = config["quantization_config"].get("quant_method", "?")
        raise UsageError(f"--model_dir '{model_dir}' is already quantized (quant_method '{method}'); pass the float model")
    return config


def check_group_divides(config: dict, group_size: int, flag: str) -> None:
    text_config = config.get("text_config", config)
    for field in ("hidden_size", "intermediate_size"):
        width = text_config.get(field)
        if isinstance(width, int) and width % group_size:
            raise UsageError(f"{flag} {group_size} does not divide config.json {field}={width}")


def validate(args) -> dict:
    """Every cheap check, before torch/quark are imported. Returns the resolved plan."""
    canonical, spec, named_group = resolve_scheme(args.quant_scheme)
    group_size = named_group or args.group_size
    model_config = read_model_config(Path(args.model_dir))
    if spec.per_group:
        check_group_size(group_size, "--group_size")
        check_group_divides(model_config, group_size, "--group_size")
    layer_config = parse_layer_overrides(args, spec, group_size)
    for pattern, layer_scheme in layer_config.items():
        if "_wo_" in layer_scheme and layer_scheme.rsplit("_", 1)[-1].isdigit():
            check_group_divides(model_config, int(layer_scheme.rsplit("_", 1)[-1]), f"layer '{pattern}' group size")

    algorithm = (args.quant_algo or "none").lower()
    if algorithm not in ALGORITHMS:
        raise UsageError(f"unknown --quant_algo '{args.quant_algo}'; supported: {', '.join(ALGORITHMS)}")
    if algorithm in ALGORITHM_FAMILIES and spec.family not in ALGORITHM_FAMILIES[algorithm]:
        raise UsageError(
            f"--quant_algo {algorithm} does not apply to --quant_scheme {canonical}; "
            f"it is meant for: {', '.join(sorted(ALGORITHM_FAMILIES[algorithm]))}"
        )
    try:
        calib_text.check_source(args.dataset)
    except calib_text.DatasetSourceError as exc:
        raise UsageError(str(exc)) from None

    if args.execution_provider and not args.onnx_out:
        raise UsageError("-e/--execution_provider needs --onnx_out DIR")
    if args.onnx_out and not args.execution_provider:
        raise UsageError("--onnx_out needs -e/--execution_provider (one of cpu, cuda, rocm, migraphx)")
    if args.execution_provider and not args.skip_ep_check:
        for key in (spec.family, "kv_fp8" if args.kv_cache_dtype == "fp8" else None):
            reason = REFUSED_COMBINATIONS.get((key, args.execution_provider))
            if key and reason:
                raise UsageError(f"-e {args.execution_provider} with {args.quant_scheme}"
                                 f"{' + --kv_cache_dtype fp8' if key == 'kv_fp8' else ''}: {reason}")
    if args.num_calib_data < 1 or args.seq_len < 2:
        raise UsageError("--num_calib_data must be >= 1 and --seq_len >= 2")
    return dict(
        scheme=canonical, spec=spec, group_size=group_size if spec.per_group else None,
        template_scheme=template_scheme_name(spec, group_size), layer_config=layer_config,
        algorithm=None if algorithm in ("none", "rtn") else algorithm, model_config=model_config,
    )


class StageClock:
    """Prints '[i/n] what ... done in X s' lines and keeps the timings for the info file."""

    def __init__(self, total: int):
        self.total, self.index, self.seconds = total, 0, {}

    def run(self, name: str, fn, *fn_args, **fn_kwargs):
        self.index += 1
        print(f"[{self.index}/{self.total}] {name} ...", flush=True)
        start = time.perf_counter()
        result = fn(*fn_args, **fn_kwargs)
        self.seconds[name] = round(time.perf_counter() - start, 2)
        print(f"[{self.index}/{self.total}] {name}: done in {self.seconds[name]:.1f} s", flush=True)
        return result


def import_quark(quiet: bool):
    import os

    if quiet:  # Quark logs every module it touches at INFO level
        os.environ.setdefault("QUARK_LOG_LEVEL", "warning")
    import torch  # noqa: F401
    import quark  # noqa: F401
    from quark.torch import LLMTemplate  # noqa: F401


def load_model(model_dir: str, data_type: str, device: str):
    import torch
    from transformers import AutoModelForCausalLM

    dtype = "auto" if data_type == "auto" else getattr(torch, data_type)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
    return model.to(device).eval()


def load_tokenizer(model_dir: str):
    """The model's own tokenizer, or None (then calibration uses random ids, with a warning)."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(model_dir)
    except Exception as exc:  # no tokenizer files, or unreadable ones
        print(f"warning: no usable tokenizer in {model_dir} ({type(exc).__name__}); "
              "calibrating on random token ids", flush=True)
        return None


def calibration_batches(tokenizer, model_config: dict, dataset: str | None, num_samples: int, seq_len: int,
                        device: str):
    """num_samples tensors [1, seq_len] cut from the tokenized dataset text (wrapping if it is short)."""
    import torch

    text_config = model_config.get("text_config", model_config)
    vocab_size = int(text_config.get("vocab_size", 32000))
    max_positions = text_config.get("max_position_embeddings")
    if isinstance(max_positions, int) and seq_len > max_positions:
        print(f"warning: --seq_len {seq_len} > max_position_embeddings {max_positions}; using {max_positions}")
        seq_len = max_positions
    if tokenizer is None:
        generator = torch.Generator().manual_seed(0)
        low = min(3, vocab_size - 1)
        return [torch.randint(low, vocab_size, (1, seq_len), generator=generator).to(device)
                for _ in range(num_samples)]
    texts = calib_text.load_texts(dataset)
    token_ids = tokenizer("\n\n".join(texts), add_special_tokens=False)["input_ids"]
    token_ids = [t for t in token_ids if t < vocab_size]
    if len(token_ids) < 2:
        raise UsageError(f"dataset '{dataset or calib_text.BUILTIN_DATASET_NAME}' gives fewer than 2 tokens")
    needed = num_samples * seq_len
    if len(token_ids) < needed:
        print(f"note: dataset has {len(token_ids)} tokens, {needed} wanted; windows wrap around the text")
        token_ids = (token_ids * (needed // len(token_ids) + 1))[:needed]
    return [torch.tensor([token_ids[i * seq_len:(i + 1) * seq_len]], device=device) for i in range(num_samples)]


def build_quant_config(plan: dict, args, model_type: str):
    from quark.torch import LLMTemplate
    from quark.torch.quantization.config import template as template_module

    try:
        template = LLMTemplate.get(model_type)
    except ValueError:
        raise UsageError(f"amd-quark has no LLMTemplate for model_type '{model_type}'; "
                         f"available: {', '.join(LLMTemplate.list_available())}") from None
    scheme_classes = {"uint4_group": template_module.Uint4WeightOnlyScheme,
                      "int4_group": template_module.Int4WeightOnlyScheme}
    for scheme_name in {plan["template_scheme"], *plan["layer_config"].values()}:
        if scheme_name not in LLMTemplate.get_supported_schemes():
            family = "uint4_group" if scheme_name.startswith("uint4_wo_") else "int4_group"
            group = int(scheme_name.rsplit("_", 1)[-1])
            LLMTemplate.register_scheme(scheme_name, scheme_classes[family](group_size=group).config)

    exclude = template.exclude_layers_name if args.exclude_layers is None else list(args.exclude_layers)
    # A per-layer override must not be cancelled by the template's default exclude list (lm_head).
    overridden = [name for name in exclude if name in plan["layer_config"]]
    if overridden:
        print(f"note: {', '.join(overridden)} removed from the exclude list (per-layer override given)")
        exclude = [name for name in exclude if name not in overridden]
    try:
        return template.get_config(
            scheme=plan["template_scheme"], algorithm=plan["algorithm"],
            kv_cache_scheme=args.kv_cache_dtype, layer_config=plan["layer_config"] or None,
            exclude_layers=exclude,
        )
    except NotImplementedError as exc:  # e.g. no built-in awq layer config for this architecture
        raise UsageError(str(exc).splitlines()[0]) from None


def quantize(model, quant_config, batches):
    from torch.utils.data import DataLoader
    from quark.torch import ModelQuantizer

    quantizer = ModelQuantizer(quant_config)
    model = quantizer.quantize_model(model, DataLoader(batches, batch_size=None))
    return quantizer.freeze(model)


def export(model, output_dir: Path, model_dir: Path, info: dict) -> list[str]:
    import torch
    from quark.torch import export_safetensors

    output_dir.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        export_safetensors(model, str(output_dir), custom_mode="quark",
                           weight_format="real_quantized", pack_method="reorder")
    for name in TOKENIZER_FILES:  # export_safetensors may already have written some of them
        source = model_dir / name
        if source.is_file() and not (output_dir / name).exists():
            shutil.copy2(source, output_dir / name)
    (output_dir / PIPELINE_INFO_FILE).write_text(json.dumps(info, indent=1))
    return [name for name in TOKENIZER_FILES if (output_dir / name).is_file()]


def run_builder(quark_dir: Path, onnx_dir: Path, ep: str) -> None:
    # Absolute paths: the builder runs from the repository root so that `-m builder` is this checkout's.
    command = [sys.executable, "-m", "builder", "-i", str(quark_dir.resolve()), "-o", str(onnx_dir.resolve()), "-e", ep]
    print("  $ " + " ".join(command), flush=True)
    completed = subprocess.run(command, cwd=REPO_ROOT)
    if completed.returncode != 0:
        raise RuntimeError(f"builder exited with code {completed.returncode}")


def run_verification(onnx_dir: Path, quark_dir: Path, json_path: Path | None) -> dict:
    from builder import verify

    return verify.run_verify(str(onnx_dir), reference=str(quark_dir), json_out=str(json_path) if json_path else None,
                             print_table=True)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model_dir", required=True, help="local float Hugging Face model folder")
    parser.add_argument("--output_dir", required=True, help="where the Quark hf_format export is written")
    parser.add_argument("--quant_scheme", required=True,
                        help=f"one of {', '.join(SCHEMES)} (or Quark names: {', '.join(SCHEME_ALIASES)}, uint4_wo_<G>)")
    parser.add_argument("--group_size", type=int, default=128, help="group size of per-group schemes (default 128)")
    parser.add_argument("--layer_group_size", action="append", metavar="PATTERN=N",
                        help="per-layer group size, repeatable, e.g. lm_head=32 (quantizes lm_head)")
    parser.add_argument("--group_size_per_layer", action="append", nargs=2, metavar=("PATTERN", "N"),
                        help="Quark <= 0.10 spelling of --layer_group_size")
    parser.add_argument("--layer_quant_scheme", action="append", nargs=2, metavar=("PATTERN", "SCHEME"),
                        help="per-layer scheme, repeatable, e.g. lm_head w_int8_a_int8_per_tensor_sym")
    parser.add_argument("--exclude_layers", nargs="*", default=None,
                        help="layer names/patterns left in float (default: the template's, i.e. lm_head); "
                             "give the flag with no value to quantize every layer")
    parser.add_argument("--quant_algo", default="none", help=f"one of {', '.join(ALGORITHMS)}")
    parser.add_argument("--kv_cache_dtype", choices=["fp8"], default=None, help="quantize the KV cache (k/v_proj outputs)")
    parser.add_argument("--dataset", default=calib_text.BUILTIN_DATASET_NAME,
                        help="local .txt/.jsonl/.json file or datasets.save_to_disk folder; default: built-in text")
    parser.add_argument("--num_calib_data", type=int, default=32, help="number of calibration windows")
    parser.add_argument("--seq_len", type=int, default=512, help="tokens per calibration window")
    parser.add_argument("--data_type", choices=["auto", "float32", "bfloat16", "float16"], default="auto",
                        help="dtype the float model is loaded and quantized in (auto: config.json's)")
    parser.add_argument("--model_export", choices=["hf_format"], default="hf_format")
    parser.add_argument("--device", default=None, help="torch device for quantization (default: cuda if present, else cpu)")
    parser.add_argument("--onnx_out", default=None, help="run the ONNX builder into this folder after export")
    parser.add_argument("-e", "--execution_provider", choices=EXECUTION_PROVIDERS, default=None)
    parser.add_argument("--skip_ep_check", action="store_true", help="do not refuse known scheme/EP combinations")
    parser.add_argument("--no_verify", action="store_true", help="with -e cpu: skip the ONNX-vs-PyTorch check")
    parser.add_argument("--verify_json", default=None, help="write the verification figures to this JSON file")
    parser.add_argument("--debug", action="store_true", help="print tracebacks")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    missing = require(("torch", "quark", "transformers"), "scripts/quantize_quark.py")
    if missing:  # before any work: name the pip extra, not "stage 1 failed: ModuleNotFoundError"
        print(f"error: {missing}", file=sys.stderr)
        return EXIT_USAGE
    try:
        plan = validate(args)
    except UsageError as exc:
        print(clip(f"error: {exc}", MAX_LINE), file=sys.stderr)
        return EXIT_USAGE
    model_dir, output_dir = Path(args.model_dir), Path(args.output_dir)
    verify_here = bool(args.onnx_out) and args.execution_provider == "cpu" and not args.no_verify
    clock = StageClock(total=7 + bool(args.onnx_out) + verify_here)
    print(f"scheme {plan['scheme']} -> Quark template scheme '{plan['template_scheme']}'"
          + (f", per-layer {plan['layer_config']}" if plan["layer_config"] else "")
          + (f", algorithm {plan['algorithm']}" if plan["algorithm"] else "")
          + (", KV cache fp8" if args.kv_cache_dtype else ""), flush=True)
    try:
        clock.run("import torch + amd-quark", import_quark, not args.debug)
        import torch

        device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
        model_type = plan["model_config"].get("model_type") or plan["model_config"]["architectures"][0]
        quant_config = clock.run("build Quark config", build_quant_config, plan, args, model_type)
        model = clock.run("load float model", load_model, str(model_dir), args.data_type, device)
        tokenizer = clock.run("load tokenizer", load_tokenizer, str(model_dir))
        batches = clock.run("tokenize calibration data", calibration_batches, tokenizer, plan["model_config"],
                            args.dataset, args.num_calib_data, args.seq_len, device)
        model = clock.run(f"quantize ({len(batches)} x {batches[0].shape[1]} tokens)", quantize, model,
                          quant_config, batches)
        info = dict(source_model=str(model_dir.resolve()), scheme=plan["scheme"],
                    template_scheme=plan["template_scheme"], group_size=plan["group_size"],
                    layer_config=plan["layer_config"], algorithm=plan["algorithm"],
                    kv_cache_dtype=args.kv_cache_dtype, dataset=args.dataset, num_calib_data=len(batches),
                    seq_len=int(batches[0].shape[1]), data_type=str(next(model.parameters()).dtype),
                    seconds=dict(clock.seconds))
        copied = clock.run("export hf_format", export, model, output_dir, model_dir, info)
        print(f"  export: {output_dir} (with {', '.join(copied) or 'no tokenizer files'})")
        if args.onnx_out:
            clock.run(f"build ONNX ({args.execution_provider})", run_builder, output_dir, Path(args.onnx_out),
                      args.execution_provider)
        if verify_here:
            clock.run("verify ONNX vs PyTorch", run_verification, Path(args.onnx_out), output_dir,
                      Path(args.verify_json) if args.verify_json else None)
        elif args.onnx_out:
            print(f"  verify on the target machine: python -m builder verify {args.onnx_out} --reference {output_dir}")
    except UsageError as exc:
        print(clip(f"error: {exc}", MAX_LINE), file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:
        raise  # the reader of our output went away: run_quietly_on_closed_pipe ends quietly
    except ModuleNotFoundError as exc:
        if args.debug:
            raise
        print(f"error: {missing_package_text(exc.name or '', 'scripts/quantize_quark.py')}", file=sys.stderr)
        return EXIT_USAGE
    except Exception as exc:  # one line for users; --debug for the traceback
        if args.debug:
            raise
        first_line = (str(exc).strip().splitlines() or [""])[0][:300]
        print(f"error: stage {clock.index} failed: {type(exc).__name__}: {first_line} (rerun with --debug)",
              file=sys.stderr)
        return EXIT_FAILED
    timings = ", ".join(f"{name.split(' (')[0]} {s:.1f}s" for name, s in clock.seconds.items())
    print(f"done: {timings}")
    return 0


if __name__ == "__main__":
    sys.exit(run_quietly_on_closed_pipe(main))
