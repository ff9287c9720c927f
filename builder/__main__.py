"""Command line: `python -m builder -i QUARK_DIR -o OUT_DIR -e cpu|cuda|rocm|migraphx [...]`.

Subcommands: `inspect` (per-layer plan, writes nothing), `check` (EP rules on a built folder), `verify`
(numerics against PyTorch). Errors in the input print one line and exit with code 2 (traceback with --verbose).
"""
from __future__ import annotations

import argparse
import sys

from .errors import ConversionError

SUBCOMMANDS = ("convert", "inspect", "check", "verify")


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("-i", "--input", required=True, help="Quark hf_format export folder (config.json + safetensors)")
    p.add_argument("-e", "--execution_provider", default="cpu", help="cpu, cuda, rocm (MIGraphX) or migraphx")
    p.add_argument("-p", "--precision", default=None, choices=("fp32", "fp16", "bf16"),
                   help="activation/io dtype (default: fp32 on cpu, fp16 on GPUs)")
    p.add_argument("-c", "--cache_dir", default=None, help="unused; accepted for onnxruntime-genai CLI parity")
    p.add_argument("--extra_options", nargs="*", default=[], metavar="KEY=VALUE",
                   help="accuracy_level=N, fp8_attention=auto|off, kv_cache=auto|emulate|native|off, "
                        "mx_activations=emulate|skip, fp8_linear=..., fp4_linear=..., "
                        "int8_linear=dequantized_weight|qdq (INT8 W8A8; CPU default dequantized_weight: fp32 GEMM, "
                        "the same logits on every CPU; qdq lets ORT CPU fuse an integer GEMM, faster but on x86 "
                        "CPUs without VNNI its u8s8 kernel saturates and the logits drift), "
                        "custom_ops_library=PATH")
    p.add_argument("--verbose", action="store_true", help="show tracebacks")


def parse_extra_options(pairs: list[str]):
    from .emit_context import BuildOptions
    options = BuildOptions()
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise ConversionError("expected KEY=VALUE", field="--extra_options", value=pair)
        if key == "accuracy_level":
            if value not in ("0", "1", "2", "3", "4"):
                raise ConversionError("accuracy_level must be 0-4", field="--extra_options accuracy_level",
                                      value=value, accepted="0, 1, 2, 3, 4")
            options.accuracy_level = int(value)
        elif key in ("fp8_attention", "kv_cache", "mx_activations", "custom_ops_library"):
            setattr(options, key, value)
        elif key == "fuse_projections":
            if value not in ("0", "1", "true", "false"):
                raise ConversionError("expected 0 or 1", field="--extra_options fuse_projections", value=value)
            options.fuse_projections = value in ("1", "true")
        else:
            options.extra[key] = value
    return options


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv.pop(0) if argv and argv[0] in SUBCOMMANDS else "convert"
    verbose = "--verbose" in argv
    try:
        if command == "verify":
            from .verify import main as verify_main
            return verify_main(argv)
        if command == "check":
            return _check(argv)
        parser = argparse.ArgumentParser(prog=f"python -m builder{'' if command == 'convert' else ' ' + command}")
        _common(parser)
        if command == "convert":
            parser.add_argument("-o", "--output", required=True, help="output folder for model.onnx + genai_config")
            parser.add_argument("--dry-run", action="store_true", help="same as the inspect subcommand")
        args = parser.parse_args(argv)
        options = parse_extra_options(args.extra_options)
        if command == "inspect" or getattr(args, "dry_run", False):
            from .convert import describe_plan, plan_model
            plan, ckpt = plan_model(args.input, args.execution_provider, args.precision, options)
            ckpt.close()
            print(describe_plan(plan))
            return 0
        from .convert import convert
        convert(args.input, args.output, args.execution_provider, args.precision, options)
        return 0
    except ConversionError as exc:
        if verbose:
            raise
        print(f"error: {exc.one_line()}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _check(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m builder check")
    parser.add_argument("model_dir")
    parser.add_argument("-e", "--execution_provider", required=True)
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)
    from pathlib import Path

    from .ep_check import check_model
    from .ep_configs import get_ep
    path = Path(args.model_dir)
    path = path / "model.onnx" if path.is_dir() else path
    if not path.exists():
        raise ConversionError("model.onnx not found", file=path)
    problems = check_model(path, get_ep(args.execution_provider))
    for p in problems:
        print(p)
    print(f"{len(problems)} problem(s) for {args.execution_provider}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
