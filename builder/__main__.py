"""Command line: `python -m builder -i QUARK_DIR -o OUT_DIR -e cpu|cuda|rocm|migraphx [...]`.

Subcommands: `inspect` (per-layer plan, writes nothing), `check` (EP rules on a built folder), `verify`
(numerics against PyTorch). Errors in the input print one line and exit with code 2 (traceback with --verbose).
"""
from __future__ import annotations

import argparse
import signal
import sys

from .errors import ConversionError, Interrupted
from .options import OPTIONS

SUBCOMMANDS = ("convert", "inspect", "check", "verify")


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("-i", "--input", required=True, help="Quark hf_format export folder (config.json + safetensors)")
    p.add_argument("-e", "--execution_provider", default="cpu", help="cpu, cuda, rocm (MIGraphX) or migraphx")
    p.add_argument("-p", "--precision", default=None, choices=("fp32", "fp16", "bf16"),
                   help="activation/io dtype (default: fp32 on cpu, fp16 on GPUs)")
    p.add_argument("-c", "--cache_dir", default=None, help="unused; accepted for onnxruntime-genai CLI parity")
    p.add_argument("--extra_options", nargs="*", default=[], metavar="KEY=VALUE",
                   help="; ".join(f"{k}: {o.help}" for k, o in OPTIONS.items()))
    p.add_argument("--verbose", action="store_true", help="show tracebacks")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines or notes (warnings and errors only)")


def parse_extra_options(pairs: list[str]):
    from .options import parse_extra_options as parse
    return parse(pairs)


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
            parser.add_argument("--overwrite", action="store_true",
                                help="replace an existing -o folder even if this builder did not write it")
            parser.add_argument("--validate", action="store_true",
                                help="after building: onnx.checker and a one-token run on ONNX Runtime CPU")
        args = parser.parse_args(argv)
        options = parse_extra_options(args.extra_options)
        if command == "inspect" or getattr(args, "dry_run", False):
            from .convert import describe_plan, plan_model
            plan, ckpt = plan_model(args.input, args.execution_provider, args.precision, options)
            ckpt.close()
            print(describe_plan(plan))
            return 0
        from .convert import convert
        quiet = (lambda _msg: None) if args.quiet else None
        convert(args.input, args.output, args.execution_provider, args.precision, options, log=quiet,
                overwrite=args.overwrite, validate=args.validate)
        return 0
    except ConversionError as exc:
        if verbose:
            raise
        print(f"error: {exc.one_line()}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted (SIGINT); nothing was written", file=sys.stderr)
        return 130
    except Interrupted as exc:
        print(f"error: interrupted ({signal.Signals(exc.signum).name}); nothing was written", file=sys.stderr)
        return 128 + exc.signum
    except SystemExit:
        raise
    except BaseException as exc:  # noqa: BLE001 - the CLI boundary: never a bare traceback
        if verbose:
            raise
        print(f"error: internal error: {_describe(exc)} (rerun with --verbose for the traceback)", file=sys.stderr)
        return 1


def _describe(exc: BaseException) -> str:
    if isinstance(exc, RecursionError):
        return "RecursionError (input nested too deeply)"
    if isinstance(exc, MemoryError):
        return "MemoryError (out of memory)"
    if isinstance(exc, OSError) and exc.filename:
        return f"{exc.filename}: {exc.strerror or type(exc).__name__}"
    text = " ".join(str(exc).split())[:300]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


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
