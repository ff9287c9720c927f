"""Quark's dynamic FP4 activation fake-quant as ONNX ops (builder/ops/mx_activation.py) vs a PyTorch emulation.

The PyTorch emulation below is written from Quark 0.13's code paths, independently of the ONNX construction:
  MXFP4 scale: quantization/utils.py even_round (float32 bit trick: + 1<<21, keep sign+exponent, log2, -2, clamp)
  NVFP4 scale: amax/6 -> fp8 e4m3 fake-quant with input_scale_2 (hw_emulation fake_quantize_fp8_per_tensor_with_scale)
  e2m1 value : nearest grid value, ties to the even code (fake_quantize_element, ROUND_HALF_TO_EVEN), saturate at 6
The ONNX side rounds with Round(y/step)*step and computes the exponent with Log + a power-of-two table, so the two
share no code. Agreement must be bit-exact, in fp32 and (through a Cast) fp16 io.
"""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from builder.graph import IO_DTYPES, IO_NUMPY, GraphBuilder
from builder.ops.mx_activation import Fp4ActivationSpec, emit_fp4_activation_qdq

E2M1_GRID = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def torch_e2m1_round(y: torch.Tensor) -> torch.Tensor:
    """Nearest e2m1 magnitude; on a tie the even code (0, 1.0, 2.0, 4.0 = codes 0, 2, 4, 6) wins; saturate at 6."""
    mag = y.abs().clamp(max=6.0)
    dist = (mag.unsqueeze(-1) - E2M1_GRID).abs()
    best = dist.min(dim=-1, keepdim=True).values
    tied = dist == best
    codes = torch.arange(8)
    # among the tied codes prefer an even one (two candidates at most)
    pref = torch.where(tied, (codes % 2) * 10 + codes, torch.full_like(codes, 100))
    code = pref.argmin(dim=-1)
    return torch.sign(y) * E2M1_GRID[code]


def torch_mx_scale(amax: torch.Tensor) -> torch.Tensor:
    """Quark even_round for fp4 (ebits 2, mbits 1, emax 2) on float32 amax."""
    a = amax.to(torch.float32).clone()
    zero = a == 0
    bits = a.view(torch.int32)
    bits = (bits + (1 << 21)) & (((1 << 9) - 1) << 23)
    a = bits.view(torch.float32)
    a = torch.where(zero, torch.tensor(2.0 ** -126), a)
    e = torch.floor(torch.log2(a)) - 2
    return torch.exp2(e.clamp(-127, 127))


def torch_mxfp4_qdq(x: torch.Tensor, group: int = 32) -> torch.Tensor:
    xb = x.to(torch.float32).reshape(-1, group)
    scale = torch_mx_scale(xb.abs().amax(dim=-1, keepdim=True))
    return (torch_e2m1_round(xb / scale) * scale).reshape(x.shape)


def torch_nvfp4_qdq(x: torch.Tensor, input_scale_2: float, group: int = 16) -> torch.Tensor:
    xb = x.to(torch.float32).reshape(-1, group)
    eps = torch.finfo(torch.float32).eps
    s = xb.abs().amax(dim=-1, keepdim=True) / 6.0
    s = s.masked_fill(s == 0, eps)
    s2 = torch.tensor(input_scale_2, dtype=torch.float32)
    sq = (s / s2).clamp(-448, 448).to(torch.float8_e4m3fn).to(torch.float32) * s2
    q = torch_e2m1_round(xb / sq.masked_fill(sq == 0, eps))
    return (q * sq).reshape(x.shape)


class _Ctx:
    def __init__(self, graph, io):
        self.graph, self.io = graph, io

    @property
    def io_type(self):
        return IO_DTYPES[self.io]


def run_activation_graph(tmp_path, x: np.ndarray, spec: Fp4ActivationSpec, io: str = "fp32") -> np.ndarray:
    g = GraphBuilder(tmp_path / "act.onnx.data")
    ctx = _Ctx(g, io)
    xin = g.input("x", IO_DTYPES[io], list(x.shape))
    y = emit_fp4_activation_qdq(ctx, xin, spec, "/t")
    assert emit_fp4_activation_qdq(ctx, xin, spec, "/t2") == y, "the subgraph must be shared per input"
    g.node("Identity", [y], "/t/out", outputs=["y"])
    g.output("y", IO_DTYPES[io], list(x.shape))
    g.finish(tmp_path / "act.onnx")
    onnx.checker.check_model(str(tmp_path / "act.onnx"))
    sess = ort.InferenceSession(str(tmp_path / "act.onnx"), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x.astype(IO_NUMPY[io])})[0]


def awkward_inputs(group: int, seed: int = 0) -> np.ndarray:
    """Random log-normal magnitudes plus rows of exact ties, zeros, subnormals and near-powers of two."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((6, 5, 4 * group)) * np.exp(rng.standard_normal((6, 5, 4 * group)) * 2)).astype(
        np.float32)
    ties = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0], np.float32)
    x[0, 0] = np.resize(np.concatenate([ties, -ties]), 4 * group) * 0.5
    x[0, 1] = 0.0
    x[0, 2, :group] = 1e-40                                   # subnormal block
    for j, m in enumerate((1.75, 1.7499999, 1.0, 1.9999999)):  # block maxima on both sides of the round-up
        x[0, 3, j * group:(j + 1) * group] = rng.uniform(-1, 1, group).astype(np.float32)
        x[0, 3, j * group] = m * 2.0 ** (j - 3)
    x[1, 0] = x[1, 0] * 1e-3
    return x


@pytest.mark.parametrize("io", ["fp32", "fp16"])
def test_mxfp4_activation_matches_torch_emulation(tmp_path, io):
    x = awkward_inputs(32)
    if io == "fp16":
        x = np.clip(x, -6e4, 6e4).astype(np.float16).astype(np.float32)
    got = run_activation_graph(tmp_path, x, Fp4ActivationSpec("mxfp4", 32), io).astype(np.float32)
    want = torch_mxfp4_qdq(torch.from_numpy(x)).numpy()
    if io == "fp16":
        want = want.astype(np.float16).astype(np.float32)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("input_scale_2", [1e-3, 0.0123, 3.0])
def test_nvfp4_activation_matches_torch_emulation(tmp_path, input_scale_2):
    x = awkward_inputs(16, seed=1)
    got = run_activation_graph(tmp_path, x, Fp4ActivationSpec("nvfp4", 16, input_scale_2=input_scale_2))
    want = torch_nvfp4_qdq(torch.from_numpy(x), input_scale_2).numpy()
    np.testing.assert_array_equal(got, want)


def test_torch_e2m1_reference_is_not_trivial():
    """Guards the reference itself: ties go to the even code, values past 6 saturate, signs are kept."""
    y = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0, -0.76, -100.0])
    want = torch.tensor([0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0, -1.0, -6.0])
    assert torch.equal(torch_e2m1_round(y), want)
    assert torch_mx_scale(torch.tensor([1.75 * 4, 1.7499 * 4, 0.0])).tolist() == [2.0, 1.0, 2.0 ** -127]
