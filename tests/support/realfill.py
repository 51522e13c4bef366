"""Fill a Redis with a real run: a tiny random-weight Qwen3-MoE, the real collector, generate() steps.

Used by the reader-side tests so that what the dashboard reads is what the collector really writes.
"""
from __future__ import annotations

import torch

from moe_monitor.collectors import attach
from tests.support.tiny_models import build


def fill_with_collector(redis_url: str, run: str, steps: int = 30, gpus: int = 4, seed: int = 0) -> dict:
    """Run about `steps` steps (one prefill then decodes, repeated) into run's streams; returns
    monitor.stats() after close(), when everything has been published."""
    model = build("qwen3_moe", seed=seed)
    monitor = attach(model, redis_url=redis_url, run=run, gpus=gpus, sample_tokens=8, sample_every=1)
    gen = torch.Generator().manual_seed(seed)
    with torch.inference_mode():
        while monitor.step < steps:
            new_tokens = min(8, steps - monitor.step)
            prompt = torch.randint(3, 90, (3, 6), generator=gen)
            model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                           max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=0)
    monitor.close()
    return monitor.stats()
