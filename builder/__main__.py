"""Command line: `python -m builder -i QUARK_DIR -o OUT_DIR -e cpu|cuda|rocm|migraphx [...]`.

Subcommands: `inspect` (per-layer plan, writes nothing), `check` (EP rules on a built folder), `verify`
(numerics against PyTorch). Errors in the input print one line and exit with code 2 (traceback with --verbose).
"""
from __future__ import annotations

import argparse
import os
import signal
import sys

from .cli_text import MAX_LINE, clip, missing_package_text, os_error_text, run_quietly_on_closed_pipe
from .errors import ConversionError, Interrupted
from .options import OPTIONS

SUBCOMMANDS = ("convert", "inspect", "check", "verify")
SUMMARY = {
    "convert": "Quark hf_format export -> model.onnx + genai_config.json (the default command)",
    "inspect": "per layer: the Quark spec each linear resolves to and what will be emitted; writes nothing",
    "check": "the static rules of an execution provider on a built ONNX folder",
    "verify": "perplexity, logit difference and greedy agreement of a built model against PyTorch",
}
EXAMPLES = {
    "convert": "%(prog)s -i examples/tiny-llama-uint4-quark -o out/tiny-llama-cpu -e cpu",
    "inspect": "%(prog)s -i examples/tiny-llama-uint4-quark -e rocm",
    "check": "%(prog)s out/tiny-llama-cpu -e cpu",
    "verify": "%(prog)s out/tiny-llama-cpu --reference examples/tiny-llama-uint4-quark",
}


def program_name() -> str:
    """What the user typed: `quark-onnx` for the console script, `python -m builder` for the module."""
    name = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    return "python -m builder" if name in ("", "__main__.py", "-c", "-m") or name.endswith(".py") else name


class Parser(argparse.ArgumentParser):
    """argparse with usage errors cut to MAX_LINE characters (a 100 KB value is not echoed whole)."""

    def error(self, message: str):
        self.print_usage(sys.stderr)
        self.exit(2, clip(f"{self.prog}: error: {message}", MAX_LINE) + "\n")


def make_parser(command: str, prog: str, **kwargs) -> Parser:
    full = prog if command == "convert" else f"{prog} {command}"
    description = SUMMARY[command] + "."
    if command == "convert":
        description += ("\n\ncommands (the first argument; convert when none is given):\n" +
                        "\n".join(f"  {name:<8} {text}" for name, text in SUMMARY.items()) +
                        f"\n\nEach command has its own --help, e.g. `{prog} inspect --help`.")
    return Parser(prog=full, description=description, epilog="example:\n  " + EXAMPLES[command] % {"prog": full},
                  formatter_class=argparse.RawDescriptionHelpFormatter, **kwargs)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("-i", "--input", required=True, help="Quark hf_format export folder (config.json + safetensors)")
    p.add_argument("-e", "--execution_provider", default="cpu", help="cpu (default), cuda, rocm (MIGraphX) or migraphx")
    p.add_argument("-p", "--precision", default=None, choices=("fp32", "fp16", "bf16"),
                   help="activation/io dtype (default: fp32 on cpu, fp16 on GPUs)")
    p.add_argument("-c", "--cache_dir", default=None, help="unused; accepted for onnxruntime-genai CLI parity")
    p.add_argument("--extra_options", nargs="*", default=[], metavar="KEY=VALUE",
                   help="; ".join(f"{k}: {o.help}" for k, o in OPTIONS.items()) + " (table: docs/options.md)")
    p.add_argument("--verbose", action="store_true", help="show tracebacks")
    p.add_argument("-q", "--quiet", action="store_true",
                   help="no progress lines, progress bar or notes (warnings and errors only)")


def parse_extra_options(pairs: list[str]):
    from .options import parse_extra_options as parse
    return parse(pairs)


def main(argv: list[str] | None = None) -> int:
    """The console entry point: a closed stdout/stderr pipe ends the command quietly (exit 141)."""
    return run_quietly_on_closed_pipe(_main, argv)


def _main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv.pop(0) if argv and argv[0] in SUBCOMMANDS else "convert"
    verbose = "--verbose" in argv
    prog = program_name()
    try:
        if command == "verify":
            from .cli_text import require
            from .verify import main as verify_main
            if not any(a in ("-h", "--help") for a in argv):
                missing = require(("torch", "transformers"), "verify")
                if missing:
                    raise ConversionError(missing)
            return verify_main(argv, parser=make_parser("verify", prog))
        if command == "check":
            return _check(argv, prog)
        parser = make_parser(command, prog)
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
        from .progress import bar_wanted
        quiet = (lambda _msg: None) if args.quiet else None
        convert(args.input, args.output, args.execution_provider, args.precision, options, log=quiet,
                overwrite=args.overwrite, validate=args.validate, progress_bar=bar_wanted(quiet=args.quiet))
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
    except BrokenPipeError:
        raise  # main(): quiet exit
    except ModuleNotFoundError as exc:  # an optional package: name the pip extra
        if verbose:
            raise
        print(clip(f"error: {missing_package_text(exc.name or '', f'{prog} {command}')}", MAX_LINE),
              file=sys.stderr)
        return 2
    except OSError as exc:  # the operating system refused a path the user gave: one line, their path
        if verbose:
            raise
        print(clip(f"error: {os_error_text(exc)}", MAX_LINE), file=sys.stderr)
        return 2
    except BaseException as exc:  # noqa: BLE001 - the CLI boundary: never a bare traceback
        if verbose:
            raise
        print(clip(f"error: internal error: {_describe(exc)} (rerun with --verbose for the traceback)", MAX_LINE),
              file=sys.stderr)
        return 1


def _describe(exc: BaseException) -> str:
    if isinstance(exc, RecursionError):
        return "RecursionError (input nested too deeply)"
    if isinstance(exc, MemoryError):
        return "MemoryError (out of memory)"
    text = " ".join(str(exc).split())[:300]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _check(argv: list[str], prog: str = "python -m builder") -> int:
    parser = make_parser("check", prog)
    parser.add_argument("model_dir", help="a folder written by the builder (or a model.onnx file)")
    parser.add_argument("-e", "--execution_provider", default="cpu",
                        help="cpu (default), cuda, rocm (MIGraphX) or migraphx")
    parser.add_argument("--verbose", action="store_true", help="show tracebacks")
    args = parser.parse_args(argv)
    from pathlib import Path

    from .ep_check import check_model
    from .ep_configs import get_ep
    path = Path(args.model_dir)
    path = path / "model.onnx" if os.path.isdir(path) else path
    if not os.path.isfile(path):
        raise ConversionError("model.onnx not found", file=path)
    problems = check_model(path, get_ep(args.execution_provider))
    for p in problems:
        print(clip(p, MAX_LINE))
    print(f"{len(problems)} problem(s) for {args.execution_provider}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
