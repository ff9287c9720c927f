"""The ORT custom-op library (custom_ops/build/ort/libquark_onnx_ops.so) for tests, or a skip that says why.

Built from cached headers when needed (no network here: `python -m custom_ops.ort_library` fetches them, and
.ci/run does that first). With QO_REQUIRE_ORT_LIBRARY=1 (set by .ci/run) a missing library fails instead of
skipping, so CI cannot pass with the in-ORT tests skipped.
"""
from __future__ import annotations

import os

import pytest

from custom_ops import ort_headers, ort_library


def _missing(why: str):
    if os.environ.get("QO_REQUIRE_ORT_LIBRARY") == "1":
        pytest.fail(f"QO_REQUIRE_ORT_LIBRARY=1 but {why}")
    pytest.skip(why)


@pytest.fixture(scope="session")
def ort_ops_library() -> str:
    if ort_headers.find() is None:
        _missing(f"ORT C API header not found ({ort_headers.HOW_TO}; `python -m custom_ops.ort_library` does both)")
    try:
        return str(ort_library.build(fetch=False, log=lambda m: None))
    except (ort_headers.HeadersUnavailable, ort_library.BuildFailed) as exc:
        _missing(f"ORT custom-op library could not be built: {exc}")
