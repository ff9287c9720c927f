"""FP4 (MXFP4 / NVFP4) test helpers shared by test_mxfp4_model.py and test_nvfp4_model.py: the decoder of the
lossless FP4 re-encodings (8-bit MatMulNBits, dense W.T, or the checkpoint's bytes in MatMulMxfp4/MatMulNvfp4) and the bit-exact weight check against Quark and the
independent decoder."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from independent_decode import dequantize_export
from custom_ops import reference as ref
from onnx import numpy_helper
from onnx_helpers import matmul_nbits_nodes, onnx_layer_name


def unpack_r16(b: np.ndarray, scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """MatMulMxfp4R16 / MatMulNvfp4R16's 16-row tiles (custom_ops/src/qo_kernels.h: B [N/16, K/8, 64], byte 4r + i of
    chunk c of tile t = byte 4c + i of row 16t + r; B_scale [N/16, K/block, 16]) back to [N, K/2] / [N, K/block],
    written here from that description rather than taken from custom_ops/fp4_r16.py."""
    tiles, chunks, _ = b.shape
    rows = np.empty((tiles * 16, chunks * 4), np.uint8)
    for t in range(tiles):
        for r in range(16):
            rows[16 * t + r] = b[t, :, 4 * r:4 * r + 4].reshape(-1)
    return rows, np.concatenate([scales[t].T for t in range(tiles)], axis=0)

LOGIT_TOL = 1e-4   # fp32 ORT vs fp32 PyTorch: only summation order differs


def matmul_nbits_weights(model_dir: Path) -> dict[str, np.ndarray]:
    """Every FP4 weight as float32 [N, K]: 8-bit MatMulNBits decoded as (u - 128) * scale, or the dense W.T."""
    model = onnx.load(str(model_dir / "model.onnx"))
    out = {}
    for node, attrs, arrays in matmul_nbits_nodes(model_dir, model):
        assert attrs["bits"] == 8 and len(node.input) == 3, "FP4 re-encoding must be 8-bit with the default zero point"
        n, k, bs = attrs["N"], attrs["K"], attrs["block_size"]
        b = arrays[node.input[1]].reshape(n, k // bs, bs)
        s = arrays[node.input[2]].astype(np.float32).reshape(n, -1, 1)
        layer = node.name.rsplit("/", 1)[0]
        out[layer] = ((b.astype(np.float32) - 128.0) * s).reshape(n, k)
    arrays = {init.name: init for init in model.graph.initializer}
    for node in model.graph.node:  # fp4_linear=compact (CPU default): the checkpoint's bytes, decoded by numpy
        if node.domain == "com.quark_onnx" and node.op_type in ("MatMulMxfp4", "MatMulNvfp4", "MatMulMxfp4R16",
                                                                "MatMulNvfp4R16"):
            b, bs, *s2 = (numpy_helper.to_array(arrays[i], base_dir=str(model_dir)) for i in node.input[1:])
            if node.op_type.endswith("R16"):  # 16-row tiles: back to the checkpoint's [N, K/2] / [N, K/block]
                b, bs = unpack_r16(b, bs.view(np.uint8))
            w = (ref.dequantize_mxfp4(b, bs) if node.op_type.startswith("MatMulMxfp4")
                 else ref.dequantize_nvfp4(b, bs.view(np.uint8), s2[0]))
            out[node.name.rsplit("/", 1)[0]] = w.astype(np.float32)
    for init in model.graph.initializer:   # fp4_linear=dense: W.T stored as is
        if init.name.endswith(".weight_dequantized.T"):
            module = init.name[: -len(".weight_dequantized.T")]
            out[onnx_layer_name(module)] = numpy_helper.to_array(init, base_dir=str(model_dir)).T
    return out


def check_weights_bit_exact(export: Path, model_dir: Path) -> int:
    decoded = matmul_nbits_weights(model_dir)
    independent = dequantize_export(export / "quark")
    quark = dict(np.load(export / "quark_dequant.npz"))
    assert set(independent) == set(quark) and independent, "nothing quantized?"
    for module, w in independent.items():
        got = decoded[onnx_layer_name(module)]
        np.testing.assert_array_equal(got, w, err_msg=f"{module}: ONNX weight != independent decoder")
        np.testing.assert_array_equal(got, quark[module], err_msg=f"{module}: ONNX weight != Quark's dequantized")
    return len(independent)
