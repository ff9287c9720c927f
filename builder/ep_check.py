"""Static check of a built ONNX model against an execution provider's known constraints."""
from __future__ import annotations

from pathlib import Path

import onnx

from .ep_configs.base import EPConfig


def check_model(model_path: Path, ep: EPConfig) -> list[str]:
    """Return one message per offending node: '<node name> (<op>): <rule>'."""
    model = onnx.load(str(model_path), load_external_data=False)
    problems = []
    for rule in ep.constraints:
        for node in model.graph.node:
            message = rule(node)
            if message:
                problems.append(f"{node.name} ({node.op_type}): {message}")
    return problems
