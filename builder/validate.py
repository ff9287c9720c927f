"""`--validate`: onnx.checker on the built model, then one token through ONNX Runtime on CPU.

Run on the temporary folder before it is moved into place, so a model that fails is never left as the output.
The one-token run feeds input_ids [[bos]], attention_mask [[1]] and empty past key/values, and requires finite
logits of shape [1, 1, vocab]. Graphs whose ops have no CPU kernel (CUDA-only contrib ops) skip the run with a
note; onnx.checker still runs.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .errors import ConversionError

ORT_ELEM = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(int64)": np.int64,
            "tensor(int32)": np.int32}


def validate_model(folder: Path, output: Path, vocab_size: int, bos: int | None,
                   custom_ops_library: str | None = None) -> str:
    """Returns a one-line summary; raises ConversionError naming the output on failure."""
    import onnx
    import onnxruntime as ort
    model_path = folder / "model.onnx"
    checked = folder / ".validate.onnx"  # beside model.onnx.data, which its external references name
    try:
        onnx.save(_for_checker(onnx.load(str(model_path), load_external_data=False)), str(checked))
        onnx.checker.check_model(str(checked))
    except onnx.checker.ValidationError as exc:
        raise ConversionError(f"--validate: onnx.checker refused the model ({_first_line(exc)})",
                              file=output / "model.onnx") from None
    finally:
        checked.unlink(missing_ok=True)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    if custom_ops_library:
        so.register_custom_ops_library(str(folder / custom_ops_library))
    try:
        sess = ort.InferenceSession(str(model_path), so, providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001 - ORT raises its own exception types
        text = _first_line(exc)
        if "NOT_IMPLEMENTED" in text or "Could not find an implementation" in text:
            return f"validate: onnx.checker passed; one-token CPU run skipped (an op has no CPU kernel: {text[:160]})"
        raise ConversionError(f"--validate: ONNX Runtime CPU cannot load the model ({text[:300]})",
                              file=output / "model.onnx") from None
    feeds = {}
    token = bos if isinstance(bos, int) and 0 <= bos < vocab_size else 0
    for inp in sess.get_inputs():
        dtype = ORT_ELEM.get(inp.type)
        if dtype is None:  # bf16 io: no numpy feed type
            return f"validate: onnx.checker passed; one-token CPU run skipped ({inp.name} is {inp.type})"
        if inp.name == "input_ids":
            feeds[inp.name] = np.full((1, 1), token, dtype)
        elif inp.name in ("attention_mask",):
            feeds[inp.name] = np.ones((1, 1), dtype)
        elif inp.name == "position_ids":
            feeds[inp.name] = np.zeros((1, 1), dtype)
        elif inp.name.startswith("past_key_values"):
            shape = [1 if i == 0 else 0 if i == 2 else d for i, d in enumerate(inp.shape)]
            feeds[inp.name] = np.zeros(shape, dtype)
        else:
            raise ConversionError(f"--validate: unexpected model input {inp.name}", file=output / "model.onnx")
    try:
        logits = sess.run(["logits"], feeds)[0]
    except Exception as exc:  # noqa: BLE001
        raise ConversionError(f"--validate: one-token run failed on ORT CPU ({_first_line(exc)[:300]})",
                              file=output / "model.onnx") from None
    if logits.shape != (1, 1, vocab_size):
        raise ConversionError(f"--validate: logits have shape {list(logits.shape)}", file=output / "model.onnx",
                              accepted=str([1, 1, vocab_size]))
    if not np.isfinite(logits.astype(np.float32)).all():
        raise ConversionError("--validate: the one-token run gives non-finite logits", file=output / "model.onnx")
    return "validate: onnx.checker passed; one-token CPU run gives finite logits"


def _for_checker(model):
    """onnx.checker knows only ONNX's own schemas; ops ONNX Runtime registers in the ONNX domain without ONNX defining
    them (SimplifiedLayerNormalization, ...) are moved to a contrib domain so the checker treats them as it treats
    every com.microsoft op. The rest of the graph (node order, names, types, initializers) is checked as is."""
    import onnx
    from onnx import defs
    for node in model.graph.node:
        if node.domain in ("", "ai.onnx") and not defs.has(node.op_type):
            node.domain = "com.microsoft.nonstandard"
    for fn in model.functions:
        for node in fn.node:
            if node.domain in ("", "ai.onnx") and not defs.has(node.op_type):
                node.domain = "com.microsoft.nonstandard"
    if any(n.domain == "com.microsoft.nonstandard" for n in model.graph.node):
        model.opset_import.append(onnx.helper.make_opsetid("com.microsoft.nonstandard", 1))
    return model


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
