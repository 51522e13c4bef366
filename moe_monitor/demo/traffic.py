"""Skewed, drifting, correlated traffic whose skew comes out of the model's own routing.

Skew: each MoE layer's router gets a heavy-tailed e_score_correction_bias (the aux-loss-free balancing
bias DeepSeek-V3 routes with): a Zipf-like log-popularity over a random order of the experts. The router
still does its real group-limited top-8 on sigmoid scores + bias; the bias only tilts it.
Drift: the bias slides between two orders of the experts (a triangle wave, period `drift_period_s`), so
the hot experts move visibly within a minute.
Correlation: prompts come from a few "topics" (disjoint token ranges) and a batch holds one or two topics,
so tokens of one step route alike, as real requests do.
log_pop: a fixed log-popularity per expert instead (same in every layer, no drift; the cost-model bench's).
"""
from __future__ import annotations

import torch

from .model import VOCAB


class DriftingTraffic:
    def __init__(self, model, strength: float = 0.05, zipf_s: float = 1.1, drift_period_s: float = 60.0,
                 topics: int = 8, seed: int = 0, log_pop=None):
        self.model, self.strength, self.period = model, strength, drift_period_s
        self.gen = torch.Generator().manual_seed(seed)
        self.routers = [layer.mlp.gate for layer in model.model.layers if hasattr(layer.mlp, "gate")]
        num_experts = self.routers[0].e_score_correction_bias.numel()
        rank = torch.arange(1, num_experts + 1, dtype=torch.float32)
        zipf = -zipf_s * torch.log(rank)
        self.log_pop = zipf - zipf.mean()
        self.orders = [(torch.randperm(num_experts, generator=self.gen), torch.randperm(num_experts, generator=self.gen))
                       for _ in self.routers]
        if log_pop is not None:  # expert e gets log_pop[e] in every layer, at every time
            self.log_pop = torch.as_tensor(log_pop, dtype=torch.float32)
            self.orders = [(torch.arange(num_experts), torch.arange(num_experts)) for _ in self.routers]
        self.topic_ranges = torch.linspace(3, VOCAB, topics + 1).long()

    def drift_weight(self, t_s: float) -> float:
        """0 -> 1 -> 0 over one period: where the popularity is between its two orders."""
        phase = (t_s % self.period) / self.period
        return 1.0 - abs(2.0 * phase - 1.0)

    @torch.no_grad()
    def apply(self, t_s: float) -> float:
        """Set every router's bias for time t_s; returns the drift weight used."""
        w = self.drift_weight(t_s)
        for router, (order_a, order_b) in zip(self.routers, self.orders):
            bias = torch.empty_like(router.e_score_correction_bias)
            pop_a = torch.empty_like(bias).scatter_(0, order_a, self.log_pop)
            pop_b = torch.empty_like(bias).scatter_(0, order_b, self.log_pop)
            bias.copy_(self.strength * ((1 - w) * pop_a + w * pop_b))
            router.e_score_correction_bias.copy_(bias - bias.min())
        return w

    def prompts(self, batch: int, length: int) -> torch.Tensor:
        """int64 [batch, length] token ids, drawn from one or two topics."""
        n_topics = len(self.topic_ranges) - 1
        chosen = torch.randint(0, n_topics, (2,), generator=self.gen)
        rows = []
        for b in range(batch):
            topic = int(chosen[b % 2]) if torch.rand(1, generator=self.gen).item() < 0.5 else int(chosen[0])
            lo, hi = int(self.topic_ranges[topic]), int(self.topic_ranges[topic + 1])
            rows.append(torch.randint(lo, hi, (length,), generator=self.gen))
        return torch.stack(rows)


def steps_forever(model, traffic: DriftingTraffic, clock, stop, batch: int = 8, prompt_len: int = 48,
                  new_tokens: int = 12) -> None:
    """generate() rounds (one prefill step, then decode steps) until stop() is true."""
    with torch.inference_mode():
        while not stop():
            traffic.apply(clock())
            prompt = traffic.prompts(batch, prompt_len)
            model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), do_sample=True, top_k=20,
                           max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=0)


__all__ = ["DriftingTraffic", "steps_forever"]
