"""What a vLLM scheduler step holds, read from its SchedulerOutput on the host (pure: no vLLM import)."""
from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence


def batch_phase(num_scheduled_tokens: Mapping[str, int], spec_decode_tokens: Mapping[str, Sequence[int]],
                new_request_ids: Collection[str]) -> str:
    """"decode" when every request of the step decodes (one token, plus its speculative tokens, and it is
    not new), "prefill" when none does, "mixed" otherwise, "unknown" for an empty step. A prefill chunk of
    exactly one token reads as decode (vLLM does not say which it is)."""
    if not num_scheduled_tokens:
        return "unknown"
    decoding = [req not in new_request_ids and tokens == 1 + len(spec_decode_tokens.get(req, ()))
                for req, tokens in num_scheduled_tokens.items()]
    if all(decoding):
        return "decode"
    return "mixed" if any(decoding) else "prefill"


def step_facts(scheduler_output) -> tuple[int, str]:
    """(real tokens, phase) of a vLLM SchedulerOutput; (0, "unknown") when it lacks the fields."""
    tokens = int(getattr(scheduler_output, "total_num_scheduled_tokens", 0) or 0)
    per_request = getattr(scheduler_output, "num_scheduled_tokens", None) or {}
    spec = getattr(scheduler_output, "scheduled_spec_decode_tokens", None) or {}
    new_reqs = getattr(scheduler_output, "scheduled_new_reqs", None) or ()
    if not new_reqs and not spec and per_request and tokens == len(per_request) and max(per_request.values()) == 1:
        return tokens, "decode"  # one token each (their sum is their count, none above 1): no Python loop per step
    new = {str(getattr(req, "req_id", "")) for req in new_reqs}
    return tokens, batch_phase(per_request, spec, new)
