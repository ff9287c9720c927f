#!/usr/bin/env python3
"""Stream a greedy completion from a converted ONNX model with onnxruntime-genai (0.18 API).

    python examples/generate.py ONNX_DIR --prompt "Hello" --max_length 32
    python examples/generate.py ONNX_DIR --prompt "Hello" --chat          # wrap the prompt in the chat template
    python examples/generate.py ONNX_DIR --prompt "Hello" --ep cuda       # override genai_config's provider

ONNX_DIR holds genai_config.json, the .onnx model and the tokenizer files.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

EXIT_CLOSED_PIPE = 141  # 128 + SIGPIPE, like `cat` when its reader went away
MAX_LINE = 400


class UsageError(Exception):
    """A one-line error for the user (exit 2)."""


def check_model_dir(model_dir: str) -> None:
    if not os.path.isdir(model_dir):
        raise UsageError(f"{model_dir}: folder not found (pass the -o folder of `python -m builder`)")
    if not os.path.isfile(os.path.join(model_dir, "genai_config.json")):
        raise UsageError(f"{model_dir}: no genai_config.json; this is not a converted model folder (convert first: "
                         f"python -m builder -i QUARK_DIR -o {model_dir})")


def build_model(model_dir: str, execution_provider: str | None):
    import onnxruntime_genai as og

    config = og.Config(model_dir)
    if execution_provider:
        config.clear_providers()
        if execution_provider != "cpu":
            config.append_provider(execution_provider)
    return og.Model(config)


def generate(model_dir: str, prompt: str, max_length: int, chat: bool = False, execution_provider: str | None = None,
             out=sys.stdout) -> list[int]:
    """Greedy-decode and stream text to `out`; returns the generated token ids (prompt excluded)."""
    import onnxruntime_genai as og

    check_model_dir(model_dir)
    try:
        model = build_model(model_dir, execution_provider)
        tokenizer = og.Tokenizer(model)
    except Exception as exc:  # onnxruntime-genai's own message (missing model.onnx, tokenizer files, provider)
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise UsageError(f"{model_dir}: onnxruntime-genai cannot load it: {first}") from None
    if chat:
        prompt = tokenizer.apply_chat_template(json.dumps([{"role": "user", "content": prompt}]),
                                               add_generation_prompt=True)
    prompt_ids = tokenizer.encode(prompt)
    if len(prompt_ids) >= max_length:
        raise UsageError(f"prompt is {len(prompt_ids)} tokens, not shorter than --max_length {max_length}")

    params = og.GeneratorParams(model)
    params.set_search_options(max_length=max_length, do_sample=False)
    generator = og.Generator(model, params)
    generator.append_tokens(prompt_ids)
    stream = tokenizer.create_stream()
    new_ids: list[int] = []
    while not generator.is_done():
        generator.generate_next_token()
        token = int(generator.get_next_tokens()[0])
        new_ids.append(token)
        out.write(stream.decode(token))
        out.flush()
    return new_ids


def main(argv: list[str] | None = None) -> int:
    """Errors are one line (exit 2); a closed stdout or stderr pipe (`... | head -c 20`) ends it quietly (exit 141)."""
    try:
        try:
            code = _main(argv)
        except SystemExit:
            sys.stdout.flush()  # --help into a closed pipe fails here, inside the handler
            raise
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        for stream in (sys.stdout, sys.stderr):
            try:
                os.dup2(devnull, stream.fileno())
            except (OSError, ValueError):
                pass
        return EXIT_CLOSED_PIPE


def _main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model_dir", help="folder with genai_config.json and the ONNX model")
    ap.add_argument("--prompt", default="Hello")
    ap.add_argument("--max_length", type=int, default=64, help="prompt + generated tokens")
    ap.add_argument("--chat", action="store_true", help="apply the tokenizer's chat template to the prompt")
    ap.add_argument("--ep", dest="execution_provider", default=None,
                    help="execution provider to use instead of genai_config's (cpu, cuda, ...)")
    ap.add_argument("--print_ids", action="store_true", help="print the generated token ids after the text")
    args = ap.parse_args(argv)
    start = time.perf_counter()
    try:
        ids = generate(args.model_dir, args.prompt, args.max_length, args.chat, args.execution_provider)
    except UsageError as exc:
        print(" ".join(f"error: {exc}".split())[:MAX_LINE], file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:
        print(f'error: needs the Python package {exc.name}, which is not installed: pip install -e . (from the '
              'repository root)', file=sys.stderr)
        return 2
    seconds = time.perf_counter() - start
    print()
    if args.print_ids:
        print("ids:", ids)
    print(f"[{len(ids)} tokens in {seconds:.2f} s]", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
