"""benchmarks/run_record.py: the command line a benchmark writes into benchmarks/results names no local path."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from run_record import command_line  # noqa: E402


def test_absolute_paths_become_their_option_names():
    argv = ["--root", "/home/u/cache", "--work=/tmp/w", "--max-gib", "8", "/abs/model", "rel/dir", "--only", "a,b"]
    assert command_line("benchmarks/x.py", argv) == (
        "python benchmarks/x.py --root ROOT --work=WORK --max-gib 8 PATH rel/dir --only a,b")
