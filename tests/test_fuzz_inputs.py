"""Bounded fuzzing (hypothesis, derandomized, fixed example budget) of config.json and of safetensors headers.

Each example mutates a real amd-quark export (a field set to an arbitrary JSON value or deleted, a header entry
rewritten, raw header bytes or the length prefix replaced) and plans the conversion in-process: nothing but
ConversionError may escape, and no example may take longer than ALARM_S (a hang fails the test through SIGALRM).
"""
from __future__ import annotations

import copy
import json
import shutil
import signal
import struct
from pathlib import Path

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from bad_input_kit import read_safetensors, write_raw_safetensors  # noqa: E402
from builder.convert import plan_model  # noqa: E402
from builder.errors import ConversionError  # noqa: E402

QUARK_EXPORTS = [("llama_h64", "uint4_g64"), ("llama_h64", "fp8_w8a8_kv_attn")]
ALARM_S = 10
BUDGET = settings(max_examples=120, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))

JSON_LEAF = st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**64), st.floats(), st.text(max_size=6))
JSON_VALUE = st.recursive(JSON_LEAF, lambda c: st.one_of(st.lists(c, max_size=3),
                                                         st.dictionaries(st.text(max_size=5), c, max_size=3)),
                          max_leaves=5)


def key_paths(d, prefix=()) -> list[tuple]:
    out = []
    items = d.items() if isinstance(d, dict) else enumerate(d) if isinstance(d, list) else ()
    for k, v in items:
        out.append(prefix + (k,))
        out += key_paths(v, prefix + (k,))
    return out


def apply(doc, path: tuple, op: str, value):
    node = doc
    try:
        for k in path[:-1]:
            node = node[k]
        if op == "set":
            node[path[-1]] = value
        elif isinstance(node, dict):
            node.pop(path[-1], None)
        else:
            del node[path[-1]]
    except (KeyError, IndexError, TypeError):
        pass


class _Hang(Exception):
    pass


def plan_only_ours(src: Path) -> None:
    def alarm(_s, _f):
        raise _Hang(f"plan_model took more than {ALARM_S}s")
    old = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(ALARM_S)
    try:
        plan, ckpt = plan_model(src, "cpu")
        ckpt.close()
    except ConversionError as err:
        assert "\n" not in err.one_line()
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@pytest.fixture(scope="module")
def exports(quark_exports):
    return [quark_exports(*e) / "quark" for e in QUARK_EXPORTS]


@pytest.mark.parametrize("which", [0, 1], ids=[r for _, r in QUARK_EXPORTS])
def test_fuzz_config_json(exports, tmp_path, which):
    src = tmp_path / "src"
    shutil.copytree(exports[which], src)
    base = json.loads((src / "config.json").read_text())
    paths = key_paths(base)
    mutation = st.tuples(st.sampled_from(paths), st.sampled_from(["set", "set", "del"]), JSON_VALUE)

    @BUDGET
    @given(st.lists(mutation, min_size=1, max_size=3))
    def run(mutations):
        cfg = copy.deepcopy(base)
        for path, op, value in mutations:
            apply(cfg, path, op, value)
        (src / "config.json").write_text(json.dumps(cfg))
        plan_only_ours(src)

    run()


@pytest.mark.parametrize("which", [0, 1], ids=[r for _, r in QUARK_EXPORTS])
def test_fuzz_safetensors_header(exports, tmp_path, which):
    src = tmp_path / "src"
    shutil.copytree(exports[which], src)
    header, data = read_safetensors(src / "model.safetensors")
    paths = key_paths(header)
    structured = st.tuples(st.just("json"), st.lists(st.tuples(st.sampled_from(paths),
                                                               st.sampled_from(["set", "set", "del"]), JSON_VALUE),
                                                     min_size=1, max_size=3))
    raw = st.tuples(st.just("bytes"), st.binary(max_size=64))
    prefix = st.tuples(st.just("prefix"), st.integers(0, 2**64 - 1))

    @BUDGET
    @given(st.one_of(structured, structured, raw, prefix))
    def run(case):
        kind, payload = case
        target = src / "model.safetensors"
        if kind == "json":
            h = copy.deepcopy(header)
            for path, op, value in payload:
                apply(h, path, op, value)
            write_raw_safetensors(target, h, data)
        elif kind == "bytes":
            write_raw_safetensors(target, payload, data)
        else:
            head = json.dumps(header).encode()
            target.write_bytes(struct.pack("<Q", payload) + head + data)
        plan_only_ours(src)

    run()
