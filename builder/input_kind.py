"""What `-i` is when it is not a local Quark export folder: a file, a GGUF file, a Hub id, a name too long, nothing.

Each case is one ConversionError saying what the path is and what to do instead.
"""
from __future__ import annotations

import errno
import os
import re
from pathlib import Path

from .cli_text import OS_ADVICE
from .errors import ConversionError

GGUF_MAGIC = b"GGUF"  # the first four bytes of every GGUF file (llama.cpp's gguf.h: GGUF_MAGIC "GGUF")
# owner/name as the Hugging Face Hub spells repository ids: letters, digits, '-', '_', '.'; exactly one '/'
HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}$")


def check_input_folder(source: Path) -> None:
    """Return when `source` is a folder; otherwise ConversionError describing what it is."""
    try:
        st = os.stat(source)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            _missing(source)
        raise ConversionError(f"cannot read the input: {OS_ADVICE.get(exc.errno) or exc.strerror}",
                              file=source) from None
    if os.path.isdir(source):
        return
    import stat
    if not stat.S_ISREG(st.st_mode):
        raise ConversionError("input is not a folder (nor a regular file); -i takes the Quark export folder "
                              "(the one holding config.json and the safetensors)", file=source)
    if _is_gguf(source):
        raise ConversionError("input is a GGUF file (llama.cpp's format), not a Quark export; quantize the float "
                              "Hugging Face model with amd-quark instead (scripts/quantize_quark.py), then pass "
                              "its hf_format export folder to -i", file=source)
    hint = f" such as {source.parent}" if (source.parent / "config.json").is_file() else ""
    raise ConversionError(f"input is a file ({source.suffix or 'no extension'}), not a folder; -i takes the Quark "
                          f"export folder{hint} (the one holding config.json and the safetensors)", file=source)


def _missing(source: Path) -> None:
    text = str(source)
    if HUB_ID.match(text) and not os.path.lexists(text.split("/")[0]):
        local = text.split("/")[1]
        raise ConversionError("not a local folder; it looks like a Hugging Face Hub id: download it first, e.g. "
                              f"`huggingface-cli download {text} --local-dir {local}`, then pass -i {local}",
                              file=source)
    raise ConversionError("input model folder not found", file=source)


def _is_gguf(path: Path) -> bool:
    if path.suffix.lower() == ".gguf":
        return True
    try:
        with open(path, "rb") as f:
            return f.read(4) == GGUF_MAGIC
    except OSError:
        return False
