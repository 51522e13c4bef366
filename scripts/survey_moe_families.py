"""Survey: which installed transformers MoE families does attach() take, and does it count them exactly?

For every family of tests/support/tiny_models.py and every other model type whose config (or a nested
sub-config) declares an expert count, build it tiny with random weights from a config holding only the keys
its classes declare (tiny_models.build_any), attach(), run a text-only forward and compare each layer's
counts with the zeroed-expert ground truth of tests/collectors/test_collectors_nested.py (that of
tests/collectors/test_collectors_exact.py, for flat, list and flattened-output experts too). One subprocess per family.

    python -m scripts.survey_moe_families [model_type ...]     # a markdown table on stdout
"""
from __future__ import annotations

import copy
import dataclasses
import json
import subprocess
import sys
import warnings

_EXPERT_FIELDS = ("n_routed_experts", "num_experts", "num_local_experts", "moe_num_experts")


def candidates() -> list[str]:
    """Every model type whose config class or a sub-config class (recursively) declares an expert count."""
    from transformers import CONFIG_MAPPING

    from tests.support.tiny_models import REQUIRED, STANDARD

    def declares(cls: type, depth: int = 0) -> bool:
        fields = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
        fields |= set(getattr(cls, "attribute_map", {}) or {})
        if any(k in fields for k in _EXPERT_FIELDS):
            return True
        subs = getattr(cls, "sub_configs", {}) or {}
        return depth < 3 and any(isinstance(s, type) and s.__name__ != "AutoConfig" and declares(s, depth + 1)
                                 for s in subs.values())

    found = []
    for model_type in sorted(CONFIG_MAPPING.keys()):
        try:
            if declares(CONFIG_MAPPING[model_type]):
                found.append(model_type)
        except Exception:  # noqa: BLE001, S112
            continue
    for model_type in ("aria", "kimi_k25"):  # their text config is an AutoConfig sub-config
        if model_type in CONFIG_MAPPING and model_type not in found:
            found.append(model_type)
    ordered = REQUIRED + STANDARD
    return ordered + [m for m in found if m not in ordered]


def survey_one(model_type: str) -> dict:
    """Build, attach, forward, compare; a dict of what happened (never raises)."""
    import torch

    from moe_monitor.collectors import attach
    from tests.support.tiny_models import build_any, text_forward
    from tests.test_collectors_nested import _block_and_experts, _truth

    row: dict = {"family": model_type, "built": "", "model": "", "attach": "", "exact": ""}
    try:
        model = build_any(model_type)
    except Exception as exc:  # noqa: BLE001
        row["built"] = f"no: {type(exc).__name__}: {str(exc)[:160]}"
        return row
    row["built"], row["model"] = "yes", type(model).__name__
    try:
        monitor = attach(model, sample_tokens=0, nvml=False)
    except Exception as exc:  # noqa: BLE001
        row["attach"] = f"refused: {type(exc).__name__}: {str(exc)[:160]}"
        return row
    row["attach"] = f"ok: {len(monitor.layers)} layers, E={monitor.num_experts}, k={monitor.top_k}"
    try:
        blocks = {layer.name: _block_and_experts(model, layer) for layer in monitor.layers}
        captured, handles = {}, []
        for name, (block, _) in blocks.items():
            def grab(module, args, kwargs, name=name):  # deep copies: the forward goes on mutating its cache
                captured[name] = (copy.deepcopy(args), copy.deepcopy(kwargs))
            handles.append(block.register_forward_pre_hook(grab, with_kwargs=True))
        ids = torch.randint(3, 90, (3, 7), generator=torch.Generator().manual_seed(7))
        with torch.no_grad():
            text_forward(model, ids)
            counts = monitor.counts()
            error = monitor.stats()["last_error"]
            for h in handles:
                h.remove()
            monitor.close()
            ran = [layer for layer in monitor.layers if layer.name in captured]
            bad = []
            for row_i, layer in enumerate(monitor.layers):
                if layer.name not in captured:
                    continue
                block, experts = blocks[layer.name]
                args, kwargs = captured[layer.name]
                truth = _truth(block, experts, monitor.num_experts, args, kwargs)
                if counts[row_i].tolist() != truth:
                    bad.append(layer.name)
        row["attach"] += f" (after forward: k={monitor.top_k})"
        if error:
            row["exact"] = f"hook error: {error[:160]}"
        elif not ran:
            row["exact"] = "no MoE layer ran on text"
        elif bad:
            row["exact"] = f"NO ({len(bad)}/{len(ran)} layers differ)"
        else:
            row["exact"] = f"yes ({len(ran)}/{len(monitor.layers)} layers ran, {int(counts.sum())} slots)"
    except Exception as exc:  # noqa: BLE001
        row["exact"] = f"not checked: {type(exc).__name__}: {str(exc)[:160]}"
    return row


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--one":
        warnings.filterwarnings("ignore")
        print(json.dumps(survey_one(argv[1])))
        return 0
    families = argv or candidates()
    print("| family | model class | attach() | counts exact |")
    print("|---|---|---|---|")
    for family in families:
        try:
            proc = subprocess.run([sys.executable, "-m", "scripts.survey_moe_families", "--one", family],
                                  capture_output=True, text=True, timeout=600)
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
            row = json.loads(lines[-1]) if lines else {
                "model": "", "built": "crashed", "attach": proc.stderr.strip().splitlines()[-1:] or "",
                "exact": ""}
        except subprocess.TimeoutExpired:
            row = {"model": "", "built": "timeout", "attach": "", "exact": ""}
        attach_cell = row["attach"] if row.get("built") == "yes" else f"not built: {row['built']} {row['attach']}"
        print(f"| {family} | {row['model']} | {attach_cell} | {row['exact']} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
