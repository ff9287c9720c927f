"""The pipeline: read -> plan -> emit -> save -> genai_config. Output appears only when everything succeeded."""
from __future__ import annotations

import fnmatch
import os
import re
import shutil
import sys
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path

from . import arch as arch_registry
from . import compact_forms
from .checkpoint import Checkpoint
from .config_schema import check_generation_config, check_rotary_size
from .custom_ops_library import check_custom_ops_library, kernel_note
from .emit_context import BuildOptions, EmitContext
from .ep_configs import get_ep
from .ep_configs.base import EPConfig
from .errors import ConversionError
from .genai_config import TOKENIZER_FILES, TOKENIZER_REQUIRED, build_genai_config, copy_tokenizer_files, write_genai_config
from .graph import GraphBuilder
from .input_files import exists, list_dir, open_input, read_json
from .input_kind import check_input_folder
from .cli_text import MAX_LINE, clip
from .output_lock import output_lock
from .progress import ProgressBar
from .options import options_not_applying
from .output_dir import (make_temp, remove_tree, resolve_output, signals_raise, swap_into_place, write_error,
                         write_marker)
from .arch.llama import PREFILL_LOGITS_FORMS, prefill_logits_form
from .ops.moe import INT4_EXPERTS_FORMS, MOE_FORMS
from .quant import LinearPlan, scheme_for
from .quant.float_int8 import LM_HEAD_FORMS, FloatToInt8Linear
from .quant.float_bf16 import FloatBf16Linear
from .quant.float_bf16 import check_embedding as check_bf16_embedding
from .quant.float_linear import FloatLinear
from .quant.fp8_w8a8 import FP8_LINEAR_FORMS
from .quant.int8_w8a8 import INT8_LINEAR_FORMS
from .quant.int_weight_only import INT4_LINEAR_FORMS
from .quant.mx_gemm import AMD_ARCHES
from .quant.mxfp4 import FP4_LINEAR_METHODS, MX_ACTIVATION_OPTIONS
from .quark_reader import QuarkConfig, read_model_config


# Output specs are read by the attention variants (builder/attention_variants.py), not by the linear schemes.
# DeepSeek-V3 (MLA): Quark's FP8 KV cache is an output quantizer on kv_b_proj (builder/arch/deepseek_v3.py).
OUTPUT_QUANTIZED_PROJECTIONS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.kv_b_proj")


@dataclass
class ModelPlan:
    source: Path
    cfg: dict
    quant: QuarkConfig | None
    family: object
    hp: object
    ep: EPConfig
    io: str
    options: BuildOptions
    linears: dict[str, LinearPlan]
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # printed as "warning: ..." even with --quiet
    generation: dict = field(default_factory=dict)     # generation_config.json, validated
    attention: object = None      # callable emitting one layer's attention core
    decoder_extras: dict = field(default_factory=dict)
    search_extras: dict = field(default_factory=dict)  # genai_config "search" overrides
    # {linear name: what `inspect` says it becomes} where a block emits it in place of the scheme's own form (routed
    # experts through com.quark_onnx MatMulExperts*: builder/ops/moe.py form_note)
    layer_forms: dict = field(default_factory=dict)
    # {com.quark_onnx op: nodes} of such blocks (MatMulExperts*), counted in the kernel notes instead of the experts'
    # own dense ops
    block_ops: dict = field(default_factory=dict)
    ckpt: object = None           # the open checkpoint while planning (small tensors a block's form depends on)


def plan_model(source: str | Path, ep_name: str, precision: str | None = None,
               options: BuildOptions | None = None, ckpt: Checkpoint | None = None, *, build_library: bool = False,
               log=None) -> tuple[ModelPlan, Checkpoint]:
    """Resolve every layer and check every tensor it needs, before anything is written. On the cpu EP the custom-op
    library of the compact forms is looked up, and built when `build_library` (the conversion; inspect only looks):
    builder/compact_forms.py."""
    source = Path(source)
    check_input_folder(source)  # a file, a GGUF file, a Hub id, a missing folder: each its own message
    list_dir(source)  # an unreadable folder is refused here, not reported as "config.json not found"
    options = options or BuildOptions()
    check_options(options)
    no_library = options.custom_ops_library == compact_forms.NO_LIBRARY
    if no_library:
        options = replace(options, custom_ops_library=None)
    library_kernels = check_custom_ops_library(options.custom_ops_library) if options.custom_ops_library else ()
    ep = apply_ep_overrides(get_ep(ep_name), options)
    if no_library:
        ep = compact_forms.fp32_ep(ep, options)
    io = precision or ep.default_precision
    if io not in ep.precisions:
        raise ConversionError(f"precision not supported on {ep.name}", field="--precision", value=io,
                              accepted=", ".join(ep.precisions))
    cfg, quant = read_model_config(source)
    config_file = str(source / "config.json")
    family, hp = arch_registry.family_for(cfg, config_file)
    check_rotary_size(hp.max_positions, hp.head_dim, config_file, "max_position_embeddings")
    generation = read_generation_config(source)
    own = ckpt is None
    ckpt = ckpt or Checkpoint(source)
    try:
        args = (source, cfg, quant, config_file, family, hp, generation, ckpt)
        return _plan_compact(args, ep, io, options, library_kernels, no_library, build_library, log), ckpt
    except BaseException:
        if own:  # the shard fds are opened with the headers
            ckpt.close()
        raise


def _plan_compact(args, ep, io, options, library_kernels, no_library: bool, build_library: bool, log) -> ModelPlan:
    """_plan_layers with the cpu EP's compact defaults resolved: the library found (or built) and named in the
    options, or the fp32 forms and one warning saying why (builder/compact_forms.py)."""
    ckpt = args[7]
    auto = compact_forms.is_cpu_default(ep) and not no_library

    def with_defaults(with_library: bool, without=()) -> BuildOptions:
        defaults = compact_forms.bf16_defaults(options, ckpt, ep, with_library and not no_library)
        return replace(options, extra={**{k: v for k, v in defaults.items() if k not in without}, **options.extra})

    plan = _plan_layers(*args, ep, io, with_defaults(True), library_kernels)
    if not auto or not uses_custom_ops(plan):
        return plan
    given = options.custom_ops_library  # checked by plan_model
    path, why = (given, "") if given else compact_forms.find_or_build(build_library, log)
    if path:
        kernels = library_kernels if given else check_custom_ops_library(path)
        # a default compact form whose op this library has no kernel for would be constant-folded to fp32 at load
        # (more memory than the dense form while it folds): those keys keep the dense fp32 form
        missing = compact_forms.missing_kernels(plan, path, options)
        rows_op = missing.pop("fp4_linear") if compact_forms.rows_instead(missing, path) else None
        ep_used = replace(ep, fp4_linear=compact_forms.COMPACT_ROWS) if rows_op else ep
        plan = _plan_layers(*args, compact_forms.fp32_ep(ep_used, options, only=missing), io,
                            replace(with_defaults(True, without=missing), custom_ops_library=path), kernels)
        plan.notes += [compact_forms.missing_note(key, op, path) for key, op in missing.items()]
        if rows_op:
            plan.notes.append(compact_forms.rows_note(rows_op, path))
        if uses_custom_ops(plan) and not given:
            plan.notes.append(f"compact CPU forms: custom-op library {path}, copied into the output folder and named "
                              "in genai_config (the output also runs without it, through the ONNX-function fallbacks)")
        elif not uses_custom_ops(plan) and not given:  # nothing left for the library to run
            plan.options = replace(plan.options, custom_ops_library=None)
        return plan
    if not build_library:  # inspect: say what the conversion will do
        plan.notes.append(f"compact CPU forms: the conversion builds the custom-op library ({why}); where it cannot, "
                          "it writes the dense fp32 forms")
        return plan
    plan = _plan_layers(*args, compact_forms.fp32_ep(ep, options), io, with_defaults(False), ())
    plan.warnings.insert(0, compact_forms.fallback_warning(why))
    return plan


def uses_custom_ops(plan: ModelPlan) -> bool:
    return (any(getattr(lp.scheme, "custom_op", lambda *_: None)(lp, plan.ep, plan.io) for lp in plan.linears.values())
            or _int4_experts_compact(plan))


def _int4_experts_compact(plan: ModelPlan) -> bool:
    """int4_experts=compact (the cpu default, or chosen) on a cpu fp32 MoE with 4-bit integer weights
    (MatMulExpertsUint4/Int4, builder/ops/routed_experts.py; whether each block takes it is decided there)."""
    from .quant.int_weight_only import BITS, IntWeightOnly
    return (plan.ep.int4_experts == "compact" and plan.ep.name == "cpu" and plan.io == "fp32"
            and hasattr(plan.hp, "num_experts")
            and any(lp.scheme is IntWeightOnly and BITS[lp.spec.weight[0].dtype] == 4 for lp in plan.linears.values()))


def _plan_layers(source, cfg, quant, config_file, family, hp, generation, ckpt, ep, io, options,
                 library_kernels=()) -> ModelPlan:
    check_layer_count(ckpt, hp.num_layers, config_file)
    for tensor, shape in family.float_tensors(hp):
        check_float_tensor(ckpt, tensor, shape)
    linears: dict[str, LinearPlan] = {}
    notes: list[str] = list(ep.notes)
    for name, n_in, n_out, prefix in family.linear_layers(hp):
        weight_name = None
        spec = quant.resolve(name) if quant else None
        if name == "lm_head" and "lm_head.weight" not in ckpt:
            if not hp.tie_word_embeddings:
                raise ConversionError("lm_head.weight missing and tie_word_embeddings is false", file=source,
                                      layer="lm_head", field="tie_word_embeddings", value=False)
            weight_name, spec = "model.embed_tokens.weight", None
            notes.append("lm_head is tied to the float embedding: emitted as a float matmul on it (not re-quantized)")
        elif spec is not None and spec.weight and f"{name}.weight_scale" not in ckpt \
                and ckpt.dtype(f"{name}.weight") in ("F32", "F16", "BF16") and not spec.input_tensors:
            notes.append(f"{name}: config resolves to {spec.short()} but the checkpoint has no weight_scale; "
                         "kept float (quark_format.md pitfall 9)")
            spec = None
        if spec is not None and spec.output_tensors and not name.endswith(OUTPUT_QUANTIZED_PROJECTIONS):
            raise ConversionError("output quantization is supported on q/k/v projections only (FP8 KV cache and "
                                  "attention)", file=config_file, layer=name, field=f"{spec.source}.output_tensors",
                                  value=spec.output_tensors[0].short())
        scheme = scheme_for(spec, name, config_file)
        form = options.extra.get("lm_head")
        if name == "lm_head" and form in LM_HEAD_SCHEMES:
            if scheme is FloatLinear:
                scheme, tied_note = LM_HEAD_SCHEMES[form]
                if weight_name:
                    notes[-1] = f"lm_head is tied to the float embedding: lm_head={form} {tied_note}"
            else:
                notes.append(f"lm_head={form} not applied: the checkpoint's lm_head is already quantized")
        plan = LinearPlan(name=name, in_features=n_in, out_features=n_out, spec=spec, scheme=scheme,
                          has_bias=f"{name}.bias" in ckpt, node_prefix=prefix, weight_name=weight_name)
        scheme.check(plan, ckpt, ep)
        if plan.has_bias:
            check_float_tensor(ckpt, f"{name}.bias", (n_out,))
        linears[name] = plan
    if options.extra.get("embedding") == "bf16":
        check_bf16_embedding(ckpt, ep)
    kernel_notes_at = len(notes)  # the kernel notes go here once the family has said which blocks take which op
    if prefill_logits_form(options, ep.name) == "last":
        notes.append("logits: each sequence's last position only ([batch, 1, vocab]; a prompt runs the lm_head once; "
                     "onnxruntime-genai reads it as a pruned model); --extra_options prefill_logits=all for every "
                     "position (teacher-forced perplexity)")
    model_plan = ModelPlan(source, cfg, quant, family, hp, ep, io, options, linears, notes)
    model_plan.generation = generation
    model_plan.ckpt = ckpt
    if hasattr(family, "check_plans"):  # what a family cannot express about its resolved layers or on this EP
        family.check_plans(model_plan)
    if hasattr(family, "plan_notes"):  # how the family's special blocks will be emitted (MoE: routed or dense)
        notes.extend(family.plan_notes(model_plan))
    custom = Counter(op for name, lp in linears.items() if name not in model_plan.layer_forms
                     and (op := getattr(lp.scheme, "custom_op", lambda *_: None)(lp, ep, io)))
    custom.update(model_plan.block_ops)
    notes[kernel_notes_at:kernel_notes_at] = [kernel_note(op, n, ep.name, options.custom_ops_library, library_kernels)
                                              for op, n in custom.items()]
    from .attention_plan import choose_attention  # late import: attention variants register themselves
    choose_attention(model_plan, ckpt)
    if ep.plan_notes is not None:
        model_plan.notes.extend(ep.plan_notes(model_plan))
    model_plan.warnings += options_not_applying(model_plan)
    for name in TOKENIZER_FILES:  # copied at the end: refused now if they cannot be read (FIFO, loop, ...)
        if exists(source / name):
            os.close(open_input(source / name, source))
    if not any(exists(source / n) for n in TOKENIZER_REQUIRED):
        model_plan.warnings.append(f"no tokenizer files in {source} ({', '.join(TOKENIZER_REQUIRED)}, "
                                   f"{TOKENIZER_CONFIG}): onnxruntime-genai cannot load the output without them; "
                                   "copy them from the float model the export was made from into the output folder")
    elif not exists(source / TOKENIZER_CONFIG):
        model_plan.warnings.append(f"{TOKENIZER_CONFIG} missing in {source} (the other tokenizer files are there): "
                                   "og.Tokenizer cannot load the output without it (it reads the tokenizer class and "
                                   "special tokens from it); copy it from the float model the export was made from "
                                   "into the output folder")
    if quant is None:
        model_plan.warnings.append(f"{config_file} has no quantization_config: this is a float model, not a Quark "
                                   f"export; the output is a float ONNX model ({io} weights and activations, no "
                                   "quantization). Quantize it with amd-quark first (scripts/quantize_quark.py) for "
                                   "a quantized model")
    else:
        model_plan.warnings += unmatched_patterns(quant, ckpt, linears)
    return model_plan


TOKENIZER_CONFIG = "tokenizer_config.json"


def unmatched_patterns(quant: QuarkConfig, ckpt: Checkpoint, linears: dict) -> list[str]:
    """A warning for each layer_quant_config key and exclude entry that names no layer of the model: a typo there
    silently quantizes (or keeps float) what the user meant otherwise."""
    modules = set(linears)
    for tensor in ckpt.names():
        parts = tensor.split(".")
        modules.update(".".join(parts[:i]) for i in range(1, len(parts)))

    def matches(pattern: str) -> bool:
        return pattern in modules or any(fnmatch.fnmatchcase(m, pattern) for m in modules)
    warnings = []
    for where, patterns in (("layer_quant_config", [k for k, _ in quant.layer_specs]), ("exclude", quant.exclude)):
        for pattern in patterns:
            if not matches(pattern):
                warnings.append(f"{quant.config_file}: quantization_config.{where} entry {clip(repr(pattern), 80)} "
                                "matches no "
                                "layer of this model (a typo?); it has no effect")
    return warnings


LAYER_INDEX = re.compile(r"^model\.layers\.(\d+)\.")


def check_layer_count(ckpt: Checkpoint, num_layers: int, config_file: str) -> None:
    """Every model.layers.N in the checkpoint must be a layer config.json describes, and the other way round."""
    present = {int(m.group(1)) for m in map(LAYER_INDEX.match, ckpt.names()) if m}
    extra = sorted(i for i in present if i >= num_layers)
    if extra:
        raise ConversionError(f"the checkpoint has layers up to model.layers.{extra[-1]} ({len(present)} layers) "
                              "that config.json does not describe", file=config_file, field="num_hidden_layers",
                              value=num_layers, accepted=f"{max(present) + 1} (the checkpoint's layers)")
    missing = sorted(set(range(num_layers)) - present)
    if missing:
        raise ConversionError(f"the checkpoint has no tensors for model.layers.{missing[0]} "
                              f"({len(present)} layers present)", file=config_file, field="num_hidden_layers",
                              value=num_layers, accepted=f"{max(present) + 1 if present else 0} (the checkpoint's "
                              "layers)")


def read_generation_config(source: Path) -> dict:
    path = source / "generation_config.json"
    if not exists(path):
        return {}
    gen = read_json(path, source)
    check_generation_config(gen, str(path))
    return gen


# --extra_options that choose among a fixed set of forms, with the values each takes. These override the EP
# profile's field of the same name.
EP_OVERRIDES = {"fp8_linear": FP8_LINEAR_FORMS, "int8_linear": INT8_LINEAR_FORMS, "fp4_linear": FP4_LINEAR_METHODS,
                "int4_linear": INT4_LINEAR_FORMS, "int4_experts": INT4_EXPERTS_FORMS}
# --extra_options lm_head forms that replace a float lm_head: (scheme, what happens to a tied embedding)
LM_HEAD_SCHEMES = {"int8": (FloatToInt8Linear, "quantizes a copy of it to 8 bits"),
                   "bf16": (FloatBf16Linear, "reads its bf16 bits (one table with embedding=bf16, else a copy)")}

AMD_EPS = ("rocm", "migraphx")  # --extra_options amd_arch (builder/quant/mx_gemm.py)
OPTION_CHOICES = {**EP_OVERRIDES, "amd_arch": AMD_ARCHES,
                  "moe": MOE_FORMS, "lm_head": LM_HEAD_FORMS,
                  "prefill_logits": PREFILL_LOGITS_FORMS}


def check_options(options: BuildOptions) -> None:
    """Every choice-valued option, refused before anything is read or written."""
    chosen = dict(options.extra, mx_activations=options.mx_activations)
    for key, allowed in {**OPTION_CHOICES, "mx_activations": MX_ACTIVATION_OPTIONS}.items():
        if key in chosen and chosen[key] not in allowed:
            raise ConversionError(f"unknown {key} form", field=f"--extra_options {key}", value=chosen[key],
                                  accepted=", ".join(allowed))


def apply_ep_overrides(ep: EPConfig, options: BuildOptions) -> EPConfig:
    """The EP profile with the user's per-scheme form choices applied (refused where the EP cannot read the form)."""
    arch = options.extra.get("amd_arch")
    if arch is not None:
        if ep.name not in AMD_EPS:
            raise ConversionError(f"amd_arch chooses AMD GPU graph forms; it applies to {', '.join(AMD_EPS)}, not "
                                  f"-e {ep.name}", field="--extra_options amd_arch", value=arch,
                                  accepted=f"-e {' or -e '.join(AMD_EPS)}")
        ep = replace(ep, amd_arch=arch)
    for key in EP_OVERRIDES:
        value = options.extra.get(key)
        if value in compact_forms.CPU_ONLY_FORMS and ep.name != "cpu":
            raise ConversionError(f"{key}={value} is a cpu EP form (its kernels are CPU kernels)",
                                  field=f"--extra_options {key}", value=value,
                                  accepted=", ".join(v for v in EP_OVERRIDES[key] if v not in compact_forms.CPU_ONLY_FORMS))
        why = ep.refused_forms.get(key, {}).get(options.extra.get(key))
        if why:
            raise ConversionError(f"{key}={options.extra[key]} is not readable on {ep.name}: {why}",
                                  field=f"--extra_options {key}", value=options.extra[key],
                                  accepted=", ".join(v for v in EP_OVERRIDES[key] if v not in ep.refused_forms[key]))
    if (ep.int4_linear == compact_forms.COMPACT and "int4_linear" not in options.extra
            and options.accuracy_level not in (None, 1)):
        ep = replace(ep, int4_linear="matmul_nbits")  # an explicit accuracy_level other than 1 asks for MatMulNBits
    return replace(ep, **{key: options.extra[key] for key in EP_OVERRIDES if key in options.extra})


def check_float_tensor(ckpt: Checkpoint, tensor: str, shape: tuple[int, ...]) -> None:
    if tuple(ckpt.shape(tensor)) != tuple(shape):
        raise ConversionError("tensor shape does not match config.json", file=ckpt.model_dir, layer=tensor,
                              field="shape", value=list(ckpt.shape(tensor)), accepted=str(list(shape)))
    if ckpt.dtype(tensor) not in ("F32", "F16", "BF16"):
        raise ConversionError("expected a float tensor", file=ckpt.model_dir, layer=tensor, field="dtype",
                              value=ckpt.dtype(tensor), accepted="F32, F16, BF16")


def convert(source: str | Path, output: str | Path, ep_name: str = "cpu", precision: str | None = None,
            options: BuildOptions | None = None, log=None, *, overwrite: bool = False, validate: bool = False,
            warn=None, progress_bar: bool = False) -> ModelPlan:
    """Plan, then write to a temporary folder beside the output and swap it into place when complete.
    `log` gets progress lines and notes, `warn` warnings (both default to stderr); `progress_bar` draws a bar with an
    ETA on stderr while the layers are emitted (the CLI asks for it on a terminal without -q). One conversion at a
    time into one output: a second one fails naming the first's process (builder/output_lock.py)."""
    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    warn = warn or (lambda msg: print(clip(f"warning: {msg}", MAX_LINE), file=sys.stderr, flush=True))
    t0 = time.perf_counter()
    output = Path(output)
    target = resolve_output(Path(source), output, overwrite)
    plan, ckpt = plan_model(source, ep_name, precision, options, build_library=True, log=log)
    for message in plan.warnings:
        warn(message)
    log(f"[1/3] planned {len(plan.linears)} linears of {plan.hp.architecture} for {plan.ep.name} "
        f"({plan.io}) in {time.perf_counter() - t0:.1f}s")
    tmp = graph = None
    try:
        with signals_raise():
            try:
                target.parent.mkdir(parents=True, exist_ok=True)
                with output_lock(target, output):
                    tmp = make_temp(target, warn)
                    graph = GraphBuilder(tmp / "model.onnx.data")
                    _write_output(plan, ckpt, graph, tmp, output, log, t0, validate, progress_bar)
                    swap_into_place(tmp, target)
            except BaseException as exc:
                if graph is not None:
                    graph.abort()
                if tmp is not None:
                    remove_tree(tmp)
                if isinstance(exc, OSError):  # disk full, file-size limit, permissions: one line naming -o
                    raise write_error(exc, output) from None
                raise
    finally:
        ckpt.close()
    for note in plan.notes:
        log(f"note: {note}")
    log(f"done: {output} in {time.perf_counter() - t0:.1f}s")
    return plan


def _write_output(plan: ModelPlan, ckpt: Checkpoint, graph: GraphBuilder, tmp: Path, output: Path, log, t0: float,
                  validate: bool, progress_bar: bool = False) -> None:
    ctx = EmitContext(graph, ckpt, plan.ep, plan.io, plan.options, plan.quant, notes=plan.notes)
    _emit_with_progress(ctx, plan, log, ProgressBar(len(plan.linears), graph.bytes_reserved) if progress_bar else None)
    if plan.ep.keep_fake_quant:
        from .ops.keep_fake_quant import keep_fake_quant
        keep_fake_quant(graph)
    t1 = time.perf_counter()
    graph.finish(tmp / "model.onnx", metadata={"quark_onnx.ep": plan.ep.name, "quark_onnx.io": plan.io,
                                               ACCURACY_LEVEL_KEY: accuracy_levels(graph.nodes)})
    lib = _bundle_custom_ops_library(plan.options.custom_ops_library, tmp)
    write_genai_config(build_genai_config(plan.hp, plan.ep, plan.source, decoder_extras=plan.decoder_extras,
                                          custom_ops_library=lib, search_extras=plan.search_extras,
                                          generation=plan.generation), tmp)
    copy_tokenizer_files(plan.source, tmp)
    write_marker(tmp, {"ep": plan.ep.name, "io": plan.io})
    log(f"[3/3] saved model.onnx + model.onnx.data ({(tmp / 'model.onnx.data').stat().st_size / 2**20:.1f} MiB)"
        f" in {time.perf_counter() - t1:.1f}s")
    from .ep_check import check_model  # static EP rules on the built graph
    problems = check_model(tmp / "model.onnx", plan.ep)
    if problems:
        raise ConversionError(f"built graph breaks {len(problems)} {plan.ep.name} rule(s): {problems[0]}",
                              file=output, field="--execution_provider", value=plan.ep.name)
    if validate:
        from .validate import validate_model
        log(validate_model(tmp, output, plan.hp.vocab_size, plan.hp.bos_token_id, lib))


ACCURACY_LEVEL_KEY = "quark_onnx.accuracy_level"  # model metadata; `verify` prints it


def accuracy_levels(nodes) -> str:
    """The accuracy_level(s) of the built MatMulNBits / QMoE / MatMulExpertsUint4 / Int4 nodes: "4", "1,4", or "none"
    (no such node). com.quark_onnx MatMulUint4 / MatMulInt4 count as 1: fp32 activations, exact."""
    ops = ("MatMulNBits", "QMoE", "MatMulExpertsUint4", "MatMulExpertsInt4")
    levels = {a.i for n in nodes if n.op_type in ops for a in n.attribute if a.name == "accuracy_level"}
    if any(n.op_type in ("MatMulUint4", "MatMulInt4") and n.domain == "com.quark_onnx" for n in nodes):
        levels.add(1)
    levels = sorted(levels)
    return ",".join(map(str, levels)) if levels else "none"


def _emit_with_progress(ctx: EmitContext, plan: ModelPlan, log, bar: ProgressBar | None = None) -> None:
    """Step lines every 10 % of the linears, or (on a terminal) one bar redrawn per linear with an ETA."""
    t, total = time.perf_counter(), len(plan.linears)
    step, done = max(1, -(-total // 10)), [0]

    def progress(_linear_plan) -> None:
        done[0] += 1
        if bar is not None:
            bar.step()
        elif done[0] % step == 0 or done[0] == total:
            log(f"[2/3] emitted {done[0]}/{total} linears ({time.perf_counter() - t:.1f}s)")

    ctx.progress = progress
    try:
        plan.family.build_graph(ctx, plan.hp, plan.linears, plan.attention)
    finally:
        if bar is not None:
            bar.close()
    if bar is not None:
        log(f"[2/3] emitted {done[0]}/{total} linears ({time.perf_counter() - t:.1f}s)")


def _bundle_custom_ops_library(path: str | None, out_dir: Path) -> str | None:
    """Copy a custom-op library (checked by plan_model) into the model folder: onnxruntime-genai resolves a relative
    session_options.custom_ops_library against the model folder (custom_ops/README.md, "onnxruntime-genai")."""
    if not path:
        return None
    lib = Path(path)
    shutil.copyfile(lib, out_dir / lib.name)
    return lib.name


def describe_plan(plan: ModelPlan) -> str:
    hp = plan.hp
    lines = [f"model: {hp.architecture} ({hp.model_type}) layers={hp.num_layers} hidden={hp.hidden_size} "
             f"heads={hp.num_heads}/{hp.num_kv_heads} head_dim={hp.head_dim} vocab={hp.vocab_size}",
             f"target: ep={plan.ep.name} io={plan.io}"]
    if plan.quant:
        q = plan.quant
        lines.append(f"quark: version={q.version} pack_method={q.export.pack_method} "
                     f"weight_format={q.export.weight_format} algos={list(q.algos) or '-'} exclude={list(q.exclude)}")
    width = max(len(n) for n in plan.linears)
    for name, lp in plan.linears.items():
        spec = lp.spec.short() if lp.spec else "float"
        bias = " +bias" if lp.has_bias else ""
        extra = plan.ep.layer_note(plan, name, lp) if plan.ep.layer_note is not None else None
        form = plan.layer_forms.get(name) or lp.scheme.describe(lp, plan.ep, plan.io)
        lines.append(f"  {name:<{width}}  {spec}  ->  {form}{bias}"
                     + (f"  [{extra}]" if extra else ""))
    for note in plan.notes:
        lines.append(f"note: {note}")
    for warning in plan.warnings:
        lines.append(f"warning: {warning}")
    return "\n".join(lines)
