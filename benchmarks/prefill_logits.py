"""What the cpu default `prefill_logits=last` saves: a prompt's time and peak memory, against `prefill_logits=all`
(every position's logits), on real_size.py's layer-sliced synthetic exports with the release's vocabulary share.

    python benchmarks/prefill_logits.py [--rows fp8_kv,gpt_oss_mxfp4,qwen3_moe_mxfp4] [--layers 2] [--prefill 128 1024]
                                        [--rounds 3] [--vocab proportional|N] [--work DIR] [--json OUT]

Per row: one export (benchmarks/real_size.py write_export, `--vocab proportional`: the slice's vocabulary is the
release's x layers / depth, so that the lm_head keeps its full-model share of a prompt's work), converted with
`-e cpu` twice (`--extra_options prefill_logits=all` and `=last`; everything else the default); then per prompt
length, og runs in fresh processes, the two forms interleaved, best of --rounds: the prompt's time (after a warm-up
prompt in the same process) and the process's peak RSS (VmHWM). "logits MiB" is the prompt's logits output:
[1, P, vocab] or [1, 1, vocab] float32. Not a test; the lm_head's share of a full-depth model's prompt is larger
than the slice's only through the vocabulary, which `proportional` keeps.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import real_size  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", default="fp8_kv,gpt_oss_mxfp4,qwen3_moe_mxfp4")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--prefill", type=int, nargs="+", default=[128, 1024])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--vocab", default="proportional",
                    help="the slice's vocabulary: proportional (the lm_head's full-model share of the work), or a size "
                         "(e.g. the release's: its logits' full memory)")
    ap.add_argument("--work", default="/tmp/qo_prefill_logits")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    print(f"load {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    print("| row | slice vocab | prompt | form | prompt ms | peak RSS MiB | logits MiB |")
    print("|---|---|---|---|---|---|---|")
    rows = []
    for name in a.rows.split(","):
        _, _, release, shape = real_size.SCHEMES[name]
        vocab = real_size.slice_vocab(a.vocab, shape, a.layers)
        export = real_size.write_export(work / f"{name}_export", name, a.layers, vocab)
        outs = {form: work / f"{name}_{form}" for form in ("all", "last")}
        for form, out in outs.items():
            real_size.convert(export, out, [f"prefill_logits={form}"])
        for prompt in a.prefill:
            runs: dict[str, list] = {form: [] for form in outs}
            for _ in range(a.rounds):
                for form, out in outs.items():
                    runs[form].append(real_size.run_child(out, prompt, 1))
            best = {}  # per form: the fastest prompt, with the lowest peak RSS of the rounds (or the first error)
            for form, rs in runs.items():
                ok = [r for r in rs if "error" not in r]
                best[form] = dict(min(ok, key=lambda r: r["prefill_ms"]),
                                  decode_rss_mib=min(r["decode_rss_mib"] for r in ok)) if ok else rs[0]
            for form in outs:
                r = best[form]
                logits_mib = (prompt if form == "all" else 1) * vocab * 4 / 2**20
                row = {"row": name, "release": release, "slice_vocab": vocab, "prompt": prompt, "form": form,
                       "logits_mib": round(logits_mib, 1), **r}
                rows.append(row)
                cells = ("error: " + r["error"], "", "") if "error" in r else (
                    f"{r['prefill_ms']:.0f}", f"{r['decode_rss_mib']}", f"{logits_mib:.1f}")
                print(f"| {name} | {vocab} | {prompt} | {form} | " + " | ".join(cells) + " |", flush=True)
            a_ms, l_ms = (best[f].get("prefill_ms") for f in ("all", "last"))
            if a_ms and l_ms:
                print(f"|   |   | {prompt} | last / all | {l_ms / a_ms:.2f}x the time | "
                      f"{best['last']['decode_rss_mib'] - best['all']['decode_rss_mib']:+d} MiB | |", flush=True)
        shutil.rmtree(export)
        for out in outs.values():
            shutil.rmtree(out)
    print(f"load {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps({"load_end": os.getloadavg(), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
