"""scripts/quantize_quark.py in the tests: the tiny float model it starts from, how a test runs it, and the runs that
several heavy tests share.

Each run of the script costs ~20-30 s of amd-quark import before a few seconds of quantization, and pytest waits on
one core meanwhile. The shared runs (SCRIPT_RUNS: the same command line a test used to run itself) start one
after another in a background thread as soon as collection ends (conftest.py pytest_collection_finish), for the
selected tests that request them (fixtures uint4_g64_script_run, fp8_script_run, uint4_g32_cpu_script_run in conftest.py); a test then waits for its own run only.
"""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import threading
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
SCRIPT = REPO_ROOT / "scripts" / "quantize_quark.py"

TINY_LLAMA = dict(
    vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2,
    tie_word_embeddings=False,
)


def make_tiny_float_model(folder: Path, dtype: str = "bfloat16") -> Path:
    """A random LlamaForCausalLM (hidden 64, 2 layers) + a 256-id byte-level tokenizer, saved with save_pretrained."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**TINY_LLAMA)).to(getattr(torch, dtype))
    model.save_pretrained(folder)
    # 3 specials + 253 byte symbols, no merges: every byte is one token, so any text tokenizes in-vocab.
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for symbol in sorted(pre_tokenizers.ByteLevel.alphabet())[: TINY_LLAMA["vocab_size"] - 3]:
        vocab[symbol] = len(vocab)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>",
                            unk_token="<unk>").save_pretrained(folder)
    return folder


def run_script(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout,
                          cwd=REPO_ROOT)


def has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def _calib_jsonl(folder: Path) -> Path:
    data = folder / "calib.jsonl"
    data.write_text("\n".join(json.dumps({"text": f"sample {i}: the quick brown fox jumps over the lazy dog"})
                              for i in range(8)))
    return data


# name -> the script's arguments after --model_dir FLOAT --output_dir DIR/quark, given DIR (the run's folder).
# All start from the bf16 tiny float model (make_tiny_float_model's default).
SCRIPT_RUNS = {
    # tests/test_quantize_script.py: test_uint4_per_group_export, ..._within_quantization_error
    "uint4_g64_lmhead_g32": lambda d: ["--quant_scheme", "w_uint4_per_group_asym", "--group_size", "64",
                                       "--layer_group_size", "lm_head=32", "--num_calib_data", "4", "--seq_len", "64"],
    # tests/test_quantize_script.py: test_fp8_activation_scheme_export
    "fp8_dataset": lambda d: ["--quant_scheme", "w_fp8_a_fp8", "--dataset", str(_calib_jsonl(d)),
                              "--num_calib_data", "2", "--seq_len", "32"],
    # tests/test_quantize_script.py test_end_to_end_uint4_cpu (the ONNX and verify figures) and tests/test_verify.py
    # test_quark_export_reference_is_emulated_by_quark (the Quark export, built again by onnxruntime-genai)
    "uint4_g32_all_layers_cpu": lambda d: ["--quant_scheme", "w_uint4_per_group_asym", "--group_size", "32",
                                           "--exclude_layers", "--num_calib_data", "2", "--seq_len", "64",
                                           "--onnx_out", str(d / "onnx"), "-e", "cpu",
                                           "--verify_json", str(d / "verify.json")],
}
# One run at a time, beside pytest's own process: 2 cores. With 2 at once the heavy suite's nvcc tests ran 2-3x
# slower next to them (measured 2026-12-04 on a shared machine: heavy suite 183 s wall, its nvcc tests 71 s + 53 s).
PARALLEL = 1


class ScriptRuns:
    """The SCRIPT_RUNS of one session under `root`: start(names) launches them (PARALLEL at a time, background
    threads), get(name) waits for one -> (run folder, CompletedProcess). The float model is made on first start."""

    def __init__(self, root: Path):
        self.root = root
        self.float_model: Path | None = None
        self._threads: dict[str, threading.Thread] = {}
        self._results: dict[str, object] = {}
        self._slots = threading.Semaphore(PARALLEL)
        self._procs: list[subprocess.Popen] = []
        self._lock = threading.Lock()
        self._closed = False

    def start(self, names) -> None:
        if self.float_model is None:
            self.float_model = make_tiny_float_model(self.root / "float")
        for name in names:
            if name in self._threads:
                continue
            folder = self.root / name
            folder.mkdir(parents=True)
            args = ["--model_dir", str(self.float_model), "--output_dir", str(folder / "quark"),
                    *SCRIPT_RUNS[name](folder)]
            thread = threading.Thread(target=self._run, args=(name, args), daemon=True)
            self._threads[name] = thread
            thread.start()

    def _run(self, name: str, args: list[str]) -> None:
        with self._slots:
            try:
                with self._lock:
                    if self._closed:
                        raise RuntimeError("session ended")
                    proc = subprocess.Popen([sys.executable, str(SCRIPT), *args], stdout=subprocess.PIPE,
                                            stderr=subprocess.PIPE, text=True, cwd=REPO_ROOT)
                    self._procs.append(proc)
                out, err = proc.communicate(timeout=300)
                self._results[name] = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
            except BaseException as exc:  # noqa: BLE001 -- reported by get()
                self._results[name] = exc

    def get(self, name: str) -> tuple[Path, subprocess.CompletedProcess]:
        self.start([name])
        self._threads[name].join()
        result = self._results[name]
        if isinstance(result, BaseException):
            raise RuntimeError(f"scripts/quantize_quark.py run {name!r} failed to run: {result!r}") from result
        return self.root / name, result

    def close(self) -> None:
        with self._lock:
            self._closed = True
            for proc in self._procs:
                if proc.poll() is None:
                    proc.kill()


# the session fixtures (tests/conftest.py) that hand a test one run: fixture name -> SCRIPT_RUNS name
RUN_FIXTURES = {
    "uint4_g64_script_run": "uint4_g64_lmhead_g32",
    "fp8_script_run": "fp8_dataset",
    "uint4_g32_cpu_script_run": "uint4_g32_all_layers_cpu",
}


def wanted_runs(items) -> list[str]:
    """The SCRIPT_RUNS the selected tests request (through RUN_FIXTURES), in test order."""
    return list(dict.fromkeys(RUN_FIXTURES[n] for item in items for n in getattr(item, "fixturenames", ())
                              if n in RUN_FIXTURES))


def can_quantize() -> bool:
    return all(has_module(m) for m in ("quark", "torch", "transformers"))
