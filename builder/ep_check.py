"""Static check of a built ONNX model against an execution provider's known constraints (builder/ep_rules.py).

    check_model(path, ep) -> list[str]          errors only (conversion fails on any); warnings go to `warn`
    check_findings(model_or_path, ep) -> list[Finding]   everything, for tests and the `check` subcommand

Each message names the node, its op type, the rule and what is wrong: '<node> (<op>): [<rule>] <message>'.
Weights are never loaded; only the graph, initializer shapes/dtypes and declared value types are read.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import onnx

from .ep_configs.base import EPConfig
from .ep_rules import ERROR, WARNING, ModelView, Rule, iter_nodes


@dataclass(frozen=True)
class Finding:
    node: str        # node name ('' for a whole-model finding)
    op_type: str
    rule: str
    severity: str    # error | warning
    message: str

    def __str__(self) -> str:
        where = f"{self.node or '<unnamed>'} ({self.op_type})" if self.op_type else "model"
        return f"{where}: [{self.rule}] {self.message}"


def _load(model: onnx.ModelProto | str | Path) -> onnx.ModelProto:
    if isinstance(model, onnx.ModelProto):
        return model
    return onnx.load(str(model), load_external_data=False)


def check_findings(model: onnx.ModelProto | str | Path, ep: EPConfig) -> list[Finding]:
    proto = _load(model)
    view = ModelView.of(proto, ep)
    findings: list[Finding] = []
    for node in iter_nodes(proto.graph):  # If branches too (ops/routed_experts.py)
        for rule in ep.constraints:
            if isinstance(rule, Rule):
                message, name, severity = rule(node, view), rule.name, rule.severity
            else:  # a plain callable node -> message|None (other modules may add these): an error
                message, name, severity = rule(node), getattr(rule, "__name__", "rule"), ERROR
            if message:
                findings.append(Finding(node.name, node.op_type, name, severity, message))
    for model_rule in ep.model_constraints:
        message = model_rule.check(view, findings)
        if message:
            findings.append(Finding("", "", model_rule.name, model_rule.severity, message))
    return findings


def _print_warning(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr, flush=True)


def check_model(model_path: Path | str, ep: EPConfig, warn=_print_warning) -> list[str]:
    """Errors as one line each ('<node> (<op>): [<rule>] <message>'); each warning is passed to `warn`."""
    findings = check_findings(model_path, ep)
    if warn is not None:
        for f in findings:
            if f.severity == WARNING:
                warn(f"{ep.name}: {f}")
    return [str(f) for f in findings if f.severity == ERROR]
