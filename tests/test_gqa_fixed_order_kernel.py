"""com.quark_onnx GroupQueryAttentionFixedOrder's CPU kernel (custom_ops/src/qo_cpu_attention.c) against an
independent float64 model of GroupQueryAttention written here (rotary, cache, causal / sliding window, grouped heads),
against ORT's own com.microsoft GroupQueryAttention on the same inputs, and its one summation order: the AVX2 path
(also what AVX-512 CPUs run) and the portable C path, 1 and 2 threads, give the same bits."""
from __future__ import annotations

import numpy as np
import pytest
from test_cpu_kernel_formats import omp_threads, path  # noqa: F401  (path: the SIMD-path fixture)

from custom_ops import native

# float32 attention against float64 (scores through a D-term dot, exp, a T-term sum): relative to max |out|
REL = 2e-6


def rope_tables(max_pos: int, rotary_dim: int, theta: float = 10000.0):
    inv = 1.0 / theta ** (np.arange(0, rotary_dim, 2, dtype=np.float64) / rotary_dim)
    f = np.outer(np.arange(max_pos, dtype=np.float64), inv)
    return np.cos(f).astype(np.float32), np.sin(f).astype(np.float32)


def rotate64(x, cos, sin, pos):
    """x [..., D] float64 at positions pos (broadcast over x's leading dims but the last two: [.., S, D])."""
    r = cos.shape[1]
    c, s = cos[pos].astype(np.float64), sin[pos].astype(np.float64)
    out = x.copy()
    x1, x2 = x[..., :r], x[..., r:2 * r]
    out[..., :r] = x1 * c - x2 * s
    out[..., r:2 * r] = x2 * c + x1 * s
    return out


def reference(q, k, v, cache_k, cache_v, past, cos, sin, h, hkv, scale, window, sinks=None):
    """float64 GroupQueryAttention of one batch row: q [S, H*D], k / v [S, Hkv*D], cache [Hkv, >= past, D] holding
    the past rows; sinks [H]: each head's sink logit, one more softmax column dropped after (transformers' gpt-oss);
    returns out [S, H*D] and the rotated new key rows [Hkv, S, D]."""
    s_len, d = q.shape[0], q.shape[1] // h
    pos = past + np.arange(s_len)
    qh = rotate64(q.astype(np.float64).reshape(s_len, h, d).transpose(1, 0, 2), cos, sin, pos)
    kh = rotate64(k.astype(np.float64).reshape(s_len, hkv, d).transpose(1, 0, 2), cos, sin, pos)
    vh = v.astype(np.float64).reshape(s_len, hkv, d).transpose(1, 0, 2)
    keys = np.concatenate([cache_k[:, :past].astype(np.float64), kh], axis=1)
    vals = np.concatenate([cache_v[:, :past].astype(np.float64), vh], axis=1)
    out = np.zeros((s_len, h, d))
    for head in range(h):
        g = head // (h // hkv)
        for s in range(s_len):
            p = past + s
            lo = p - window + 1 if 0 < window <= p else 0  # window keys, the query's own included
            sc = keys[g, lo:p + 1] @ qh[head, s] * scale
            m = sc.max() if sinks is None else max(sc.max(), float(sinks[head]))
            e = np.exp(sc - m)
            denominator = e.sum() + (0.0 if sinks is None else np.exp(float(sinks[head]) - m))
            out[s, head] = e @ vals[g, lo:p + 1] / denominator
    return out.reshape(s_len, h * d), kh


def rel_err(y, ref):
    return float(np.max(np.abs(y.astype(np.float64) - ref)) / (np.max(np.abs(ref)) + 1e-30))


CASES = [  # (H, Hkv, D, rotary_dim, window, sinks)
    (4, 2, 64, 64, -1, False),
    (8, 2, 32, 16, -1, False),   # partial rotary
    (6, 3, 36, 36, 5, False),    # D % 8 != 0 (the portable arithmetic on every path), sliding window
    (4, 4, 128, 128, 24, False),
    (8, 2, 64, 64, 9, True),     # gpt-oss: sinks and a sliding window
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"H{c[0]}-KV{c[1]}-D{c[2]}-R{c[3]}-W{c[4]}{'-sinks' * c[5]}")
def test_prefill_then_decode_against_float64(case, path):
    h, hkv, d, rdim, window, with_sinks = case
    rng = np.random.default_rng(d * 7 + h)
    sinks = (rng.standard_normal(h) * 2).astype(np.float32) if with_sinks else None
    cos, sin = rope_tables(96, rdim)
    scale = d ** -0.5
    s0 = 37
    q = (rng.standard_normal((1, s0, h * d)) * 2).astype(np.float32)
    k = (rng.standard_normal((1, s0, hkv * d)) * 2).astype(np.float32)
    v = rng.standard_normal((1, s0, hkv * d)).astype(np.float32)
    empty = np.zeros((1, hkv, 0, d), np.float32)
    seqlens = np.array([s0 - 1], np.int32)
    omp_threads(2)
    path(None)
    out, pk, pv = native.gqa_fixed_order(q, k, v, empty, empty, seqlens, s0, cos, sin, h, hkv, scale, window,
                                         head_sink=sinks)
    ref, kh = reference(q[0], k[0], v[0], empty[0], empty[0], 0, cos, sin, h, hkv, scale, window, sinks)
    assert out.shape == (1, s0, h * d) and pk.shape == (1, hkv, s0, d)
    assert rel_err(out[0], ref) <= REL, rel_err(out[0], ref)
    assert np.max(np.abs(pk[0] - kh)) <= 4e-6 * np.max(np.abs(kh))
    assert np.array_equal(pv[0], v[0].reshape(s0, hkv, d).transpose(1, 0, 2))
    # decode steps on a non-shared cache (present = past + 1 row), then a 3-token continuation
    cache_k, cache_v, past = pk, pv, s0
    for step, s_len in enumerate((1, 1, 3)):
        qn = rng.standard_normal((1, s_len, h * d)).astype(np.float32)
        kn = rng.standard_normal((1, s_len, hkv * d)).astype(np.float32)
        vn = rng.standard_normal((1, s_len, hkv * d)).astype(np.float32)
        total = past + s_len
        out, pk, pv = native.gqa_fixed_order(qn, kn, vn, cache_k, cache_v, np.array([total - 1], np.int32), total,
                                             cos, sin, h, hkv, scale, window, head_sink=sinks)
        ref, _ = reference(qn[0], kn[0], vn[0], cache_k[0], cache_v[0], past, cos, sin, h, hkv, scale, window, sinks)
        assert rel_err(out[0], ref) <= REL, (step, rel_err(out[0], ref))
        assert np.array_equal(pk[:, :, :past], cache_k) and np.array_equal(pv[:, :, :past], cache_v)
        cache_k, cache_v, past = pk, pv, total


def test_shared_buffer_batch_of_two(path):
    """onnxruntime-genai's binding: past and present one [B, Hkv, max_length, D] buffer, written in place; batch rows
    with different lengths (seqlens_k) decode at their own positions."""
    h, hkv, d, max_len = 4, 2, 64, 64
    rng = np.random.default_rng(5)
    cos, sin = rope_tables(max_len, d)
    buf_k = np.zeros((2, hkv, max_len, d), np.float32)
    buf_v = np.zeros_like(buf_k)
    lengths = [11, 19]
    for b, n in enumerate(lengths):  # fill each row's past as if prompts of those lengths had run
        buf_k[b, :, :n] = rng.standard_normal((hkv, n, d))
        buf_v[b, :, :n] = rng.standard_normal((hkv, n, d))
    before_k, before_v = buf_k.copy(), buf_v.copy()
    q = rng.standard_normal((2, 1, h * d)).astype(np.float32)
    k = rng.standard_normal((2, 1, hkv * d)).astype(np.float32)
    v = rng.standard_normal((2, 1, hkv * d)).astype(np.float32)
    seqlens = np.array(lengths, np.int32)  # total - 1 = the past length for one new token
    out, pk, pv = native.gqa_fixed_order(q, k, v, buf_k, buf_v, seqlens, max(lengths) + 1, cos, sin, h, hkv,
                                         d ** -0.5, -1, share_buffer=True)
    assert pk is buf_k and pv is buf_v
    for b, n in enumerate(lengths):
        ref, kh = reference(q[b], k[b], v[b], before_k[b], before_v[b], n, cos, sin, h, hkv, d ** -0.5, -1)
        assert rel_err(out[b], ref) <= REL
        assert np.array_equal(buf_k[b, :, :n], before_k[b, :, :n])  # the past untouched
        assert np.max(np.abs(buf_k[b, :, n] - kh[:, 0])) <= 4e-6 * np.max(np.abs(kh))
        assert np.array_equal(buf_k[b, :, n + 1:], before_k[b, :, n + 1:])  # nothing past the new row


def test_one_order_on_every_path_and_thread_count(path):
    h, hkv, d = 8, 2, 64
    rng = np.random.default_rng(11)
    cos, sin = rope_tables(200, d)
    s0 = 150
    args = [rng.standard_normal((1, s0, n * d)).astype(np.float32) * 3 for n in (h, hkv, hkv)]
    empty = np.zeros((1, hkv, 0, d), np.float32)
    sinks = rng.standard_normal(h).astype(np.float32)
    results = []
    for p in ("avx512", "avx2", "portable"):
        path(p)
        for threads in (1, 2):
            omp_threads(threads)
            for head_sink in (None, sinks):
                results.append(native.gqa_fixed_order(*args, empty, empty, np.array([s0 - 1], np.int32), s0, cos, sin,
                                                      h, hkv, d ** -0.5, 48, head_sink=head_sink))
    omp_threads(2)
    for i, r in enumerate(results[2:]):
        for a, b in zip(results[i % 2], r):  # without sinks, with sinks
            assert np.array_equal(a, b)
    assert not np.array_equal(results[0][0], results[1][0])


def test_bad_arguments_are_refused():
    h, hkv, d = 4, 2, 16
    cos, sin = rope_tables(8, d)
    z = np.zeros((1, 4, h * d), np.float32)
    kv = np.zeros((1, 4, hkv * d), np.float32)
    empty = np.zeros((1, hkv, 0, d), np.float32)
    with pytest.raises(RuntimeError, match="status 1"):  # positions past the rotary tables
        native.gqa_fixed_order(z, kv, kv, np.zeros((1, hkv, 6, d), np.float32), np.zeros((1, hkv, 6, d), np.float32),
                               np.array([9], np.int32), 10, cos, sin, h, hkv)
    with pytest.raises(RuntimeError, match="status 1"):  # H not a multiple of Hkv
        native.gqa_fixed_order(np.zeros((1, 4, 3 * d), np.float32), kv, kv, empty, empty, np.array([3], np.int32), 4,
                               cos, sin, 3, hkv)


def _ort_gqa(q, k, v, past_k, past_v, seqlens, total, cos, sin, h, hkv, scale, window, sinks=None):
    import onnxruntime as ort
    from onnx import TensorProto, helper
    f, i32 = TensorProto.FLOAT, TensorProto.INT32
    names = ["query", "key", "value", "past_key", "past_value", "seqlens_k", "total_sequence_length", "cos_cache",
             "sin_cache"]
    node_inputs = names + (["", "", "head_sink"] if sinks is not None else [])  # position_ids, attention_bias absent
    node = helper.make_node("GroupQueryAttention", node_inputs, ["out", "present_key", "present_value"],
                            domain="com.microsoft", num_heads=h, kv_num_heads=hkv, scale=scale, do_rotary=1,
                            rotary_interleaved=0, local_window_size=window)
    graph_inputs = names + (["head_sink"] if sinks is not None else [])
    inputs = [helper.make_tensor_value_info(n, i32 if n in ("seqlens_k", "total_sequence_length") else f, None)
              for n in graph_inputs]
    outputs = [helper.make_tensor_value_info(n, f, None) for n in ("out", "present_key", "present_value")]
    model = helper.make_model(helper.make_graph([node], "gqa", inputs, outputs),
                              opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    values = [q, k, v, past_k, past_v, seqlens, np.array(total, np.int32), cos, sin]
    feed = dict(zip(graph_inputs, values + ([sinks] if sinks is not None else [])))
    return sess.run(None, feed)


@pytest.mark.parametrize("with_sinks", [False, True], ids=["plain", "sinks"])
def test_close_to_ort_group_query_attention(with_sinks):
    """The op is a drop-in for GroupQueryAttention: ORT's own kernel on the same inputs (with sinks: its head_sink
    input, input 11, against GroupQueryAttentionFixedOrderSinks) gives the same outputs up to float32 rounding (its
    MLAS softmax and GEMM sum in other orders), for a prompt and a decode step, sliding window included."""
    h, hkv, d = 8, 2, 64
    rng = np.random.default_rng(23 if with_sinks else 3)
    cos, sin = rope_tables(64, d)
    s0, scale, window = 29, d ** -0.5, 12 if with_sinks else 16
    q = rng.standard_normal((1, s0, h * d)).astype(np.float32)
    k = rng.standard_normal((1, s0, hkv * d)).astype(np.float32)
    v = rng.standard_normal((1, s0, hkv * d)).astype(np.float32)
    sinks = (rng.standard_normal(h) * 3).astype(np.float32) if with_sinks else None
    empty = np.zeros((1, hkv, 0, d), np.float32)
    seqlens = np.array([s0 - 1], np.int32)
    ours = native.gqa_fixed_order(q, k, v, empty, empty, seqlens, s0, cos, sin, h, hkv, scale, window, head_sink=sinks)
    theirs = _ort_gqa(q, k, v, empty, empty, seqlens, s0, cos, sin, h, hkv, scale, window, sinks)
    for a, b in zip(ours, theirs):
        assert a.shape == b.shape
        assert np.max(np.abs(a - b)) <= 2e-6 * np.max(np.abs(b))
    if with_sinks:
        without = native.gqa_fixed_order(q, k, v, empty, empty, seqlens, s0, cos, sin, h, hkv, scale, window)
        assert np.max(np.abs(without[0] - ours[0])) > 1e-2 * np.max(np.abs(ours[0]))  # the sinks matter here
    qn = rng.standard_normal((1, 1, h * d)).astype(np.float32)
    kn = rng.standard_normal((1, 1, hkv * d)).astype(np.float32)
    vn = rng.standard_normal((1, 1, hkv * d)).astype(np.float32)
    step = [np.array([s0], np.int32), s0 + 1, cos, sin, h, hkv, scale, window]
    ours = native.gqa_fixed_order(qn, kn, vn, theirs[1], theirs[2], *step, head_sink=sinks)
    theirs = _ort_gqa(qn, kn, vn, theirs[1], theirs[2], *step, sinks)
    for a, b in zip(ours, theirs):
        assert a.shape == b.shape
        assert np.max(np.abs(a - b)) <= 2e-6 * np.max(np.abs(b))


def _fixed_order_session(library: str | None, h, hkv, scale, window, sinks: bool = False):
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from custom_ops.functions import DOMAIN, function_protos
    f, i32 = TensorProto.FLOAT, TensorProto.INT32
    names = ["query", "key", "value", "past_key", "past_value", "seqlens_k", "total_sequence_length", "cos_cache",
             "sin_cache"] + (["head_sink"] if sinks else [])
    op = "GroupQueryAttentionFixedOrderSinks" if sinks else "GroupQueryAttentionFixedOrder"
    node = helper.make_node(op, names, ["out", "present_key", "present_value"],
                            domain=DOMAIN, num_heads=h, kv_num_heads=hkv, scale=scale, local_window_size=window)
    inputs = [helper.make_tensor_value_info(n, i32 if n in ("seqlens_k", "total_sequence_length") else f, None)
              for n in names]
    outputs = [helper.make_tensor_value_info(n, f, None) for n in ("out", "present_key", "present_value")]
    model = helper.make_model(helper.make_graph([node], "gqa", inputs, outputs),
                              opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(DOMAIN, 1)],
                              functions=function_protos(op, 21))
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    if library:
        so.register_custom_ops_library(library)
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]), names


@pytest.mark.parametrize("window,with_sinks", [(-1, False), (7, False), (5, True)])
def test_ort_kernel_and_function_fallback(window, with_sinks):
    """Through ORT: the registered kernel gives the C ABI's bits; without the library ORT runs the op's ONNX function
    (standard ops), within float32 rounding of the kernel and of the float64 model above."""
    from custom_ops import ort_library
    library = str(ort_library.build(fetch=True, log=lambda m: None))
    h, hkv, d = 6, 2, 32
    rng = np.random.default_rng(17 + window)
    sinks = rng.standard_normal(h).astype(np.float32) if with_sinks else None
    extra = [sinks] if with_sinks else []
    cos, sin = rope_tables(64, 12)  # partial rotary
    scale = 0.3
    s0 = 21
    feeds = []
    q = rng.standard_normal((2, s0, h * d)).astype(np.float32)
    k = rng.standard_normal((2, s0, hkv * d)).astype(np.float32)
    v = rng.standard_normal((2, s0, hkv * d)).astype(np.float32)
    empty = np.zeros((2, hkv, 0, d), np.float32)
    feeds.append([q, k, v, empty, empty, np.array([s0 - 1] * 2, np.int32), np.array(s0, np.int32), cos, sin] + extra)
    kernel, names = _fixed_order_session(library, h, hkv, scale, window, with_sinks)
    function, _ = _fixed_order_session(None, h, hkv, scale, window, with_sinks)
    first = kernel.run(None, dict(zip(names, feeds[0])))
    qn = rng.standard_normal((2, 1, h * d)).astype(np.float32)
    kn = rng.standard_normal((2, 1, hkv * d)).astype(np.float32)
    vn = rng.standard_normal((2, 1, hkv * d)).astype(np.float32)
    feeds.append([qn, kn, vn, first[1], first[2], np.array([s0] * 2, np.int32), np.array(s0 + 1, np.int32), cos, sin]
                 + extra)
    for feed in feeds:
        ours = native.gqa_fixed_order(*feed[:6], int(feed[6]), cos, sin, h, hkv, scale, window, head_sink=sinks)
        by_kernel = kernel.run(None, dict(zip(names, feed)))
        by_function = function.run(None, dict(zip(names, feed)))
        for a, b, c in zip(ours, by_kernel, by_function):
            assert np.array_equal(a, b)
            assert a.shape == c.shape and np.max(np.abs(a - c)) <= 2e-6 * np.max(np.abs(a))
        past = int(feed[6]) - feed[0].shape[1]
        for bi in range(2):
            ref, _ = reference(feed[0][bi], feed[1][bi], feed[2][bi], feed[3][bi], feed[4][bi], past, cos, sin, h, hkv,
                               scale, window, sinks)
            assert rel_err(by_kernel[0][bi], ref) <= REL


def test_model_logits_the_same_on_every_path(tmp_path, path):
    """The example export (a real amd-quark uint4 export of a tiny Llama) converted with the cpu default: its custom
    ops (MatMulUint4, MatMulBf16, GroupQueryAttentionFixedOrder) give every position's logits bit for bit the same on
    the AVX-512, AVX2 and portable paths (in one process, so ORT's own ops are the same), and within float32 rounding
    of the same export converted with GroupQueryAttention (attention=fused)."""
    from pathlib import Path

    from onnx_helpers import op_types, prompt_logits

    from builder.convert import convert
    from builder.emit_context import BuildOptions
    src = Path(__file__).resolve().parents[1] / "examples" / "tiny-llama-uint4-quark"
    everything = {"prefill_logits": "all"}
    convert(src, tmp_path / "fixed", "cpu", options=BuildOptions(extra=everything, given=("prefill_logits",)),
            log=lambda m: None)
    assert op_types(tmp_path / "fixed")["GroupQueryAttentionFixedOrder"] >= 1
    convert(src, tmp_path / "fused", "cpu", options=BuildOptions(extra={**everything, "attention": "fused"},
                                                                 given=("prefill_logits", "attention")),
            log=lambda m: None)
    ids = (np.arange(45) * 37 % 200 + 3).astype(np.int64).reshape(1, -1)  # 45 keys: past MLAS's 16 lanes
    logits = []
    for p in ("avx512", "avx2", "portable"):
        path(p)
        logits.append(prompt_logits(tmp_path / "fixed", ids))
    path(None)
    assert logits[0].shape[1] == 45 and all(np.array_equal(logits[0], x) for x in logits[1:])
    fused = prompt_logits(tmp_path / "fused", ids)
    assert np.max(np.abs(fused - logits[0])) <= 1e-5 * max(1.0, float(np.max(np.abs(fused))))

