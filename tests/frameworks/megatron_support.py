"""A tiny Megatron-Core MoE GPT that trains on the CPU (real megatron-core 0.16.1 modules), and its ground truth.

What is Megatron's own code here: GPTModel, TransformerBlock / TransformerLayer (layer numbers, pipeline
offsets), MoELayer, TopKRouter.routing (score function, group-limited top-k, expert bias, capacity dropping,
aux loss), the allgather token dispatcher and SequentialMLP experts, parallel_state over gloo. Four things
of Megatron's do not run on a CPU-only torch, each replaced by the least that lets the rest run (the exact
errors are in docs/megatron.md):
- TopKRouter.__init__ makes its expert-bias buffers on torch.cuda.current_device(): CPUTopKRouter makes them
  on the CPU.
- Router.gating moves the router weight to torch.cuda.current_device() and, without Transformer Engine,
  RouterGatingLinearFunction names an undefined te_general_gemm (NameError): CPUTopKRouter.gating is the
  non-TE branch of that function (logits = input @ weight.T in the router dtype). routing() is Megatron's.
- DotProductAttention asks the global memory buffer for a CUDA tensor: the layers have no attention
  (IdentityOp), as an MLP-only transformer.
- The alltoall dispatcher makes a torch.cuda.Stream when built: the allgather dispatcher is used.
Shapes: S sequence length, B micro-batch size, H hidden size, E experts, N = S * B tokens.
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.tensor_parallel.random import get_cuda_rng_tracker
from megatron.core.transformer.identity_op import IdentityFuncOp, IdentityOp
from megatron.core.transformer.moe.moe_layer import MoELayer
from megatron.core.transformer.moe.router import TopKRouter
from megatron.core.transformer.transformer_config import TransformerConfig

VOCAB = 64
SEQ = 16
_THREADS: list[int] = []  # torch's thread count before init_parallel


class CPUTopKRouter(TopKRouter):
    """Megatron's TopKRouter with its expert-bias buffers made on the CPU and the non-Transformer-Engine gating
    GEMM without the move to CUDA (module docstring)."""

    def __init__(self, config: TransformerConfig, pg_collection: Any = None) -> None:
        with_bias = config.moe_router_enable_expert_bias
        super().__init__(config=dataclasses.replace(config, moe_router_enable_expert_bias=False),
                         pg_collection=pg_collection)
        self.config = config
        self.enable_expert_bias = with_bias
        if with_bias:  # TopKRouter.__init__ makes these two on torch.cuda.current_device()
            del self.local_tokens_per_expert, self.expert_bias
            E = config.num_moe_experts
            self.register_buffer("local_tokens_per_expert", torch.zeros(E, dtype=torch.float32), persistent=False)
            self.register_buffer("expert_bias", torch.zeros(E, dtype=torch.float32))

    def gating(self, input: torch.Tensor) -> torch.Tensor:
        dtype = {"fp32": torch.float32, "fp64": torch.float64}.get(self.config.moe_router_dtype, input.dtype)
        bias = None if self.bias is None else self.bias.to(dtype)
        return torch.nn.functional.linear(input.to(dtype), self.weight.to(dtype), bias)


def init_parallel(rank: int = 0, world_size: int = 1, expert_parallel: int = 1, port: int | None = None) -> None:
    """gloo process group over `world_size` CPU processes and Megatron's parallel state (TP = PP = 1)."""
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port or os.environ.get("MASTER_PORT", 29631))
    if not dist.is_initialized():
        dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=datetime.timedelta(seconds=180))
    parallel_state.initialize_model_parallel(1, 1, expert_model_parallel_size=expert_parallel)
    torch.manual_seed(1234 + rank)
    _THREADS.append(torch.get_num_threads())
    torch.set_num_threads(1)  # two ranks on two cores
    get_cuda_rng_tracker().reset()  # CPU: no CUDA RNG states to fork (nothing below uses the tracker)


def shutdown_parallel() -> None:
    if _THREADS:
        torch.set_num_threads(_THREADS.pop())
    parallel_state.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()


def tiny_config(**overrides: Any) -> TransformerConfig:
    """2 MoE layers, 8 experts, top-2, hidden 32, fp32 on the CPU; DeepSeek-style routing by default (sigmoid
    scores, an expert bias, 4 groups of which 2 are kept), every other field as given."""
    fields: dict[str, Any] = dict(
        num_layers=2, hidden_size=32, num_attention_heads=4, ffn_hidden_size=64, num_moe_experts=8,
        moe_router_topk=2, moe_ffn_hidden_size=16, use_cpu_initialization=True,
        moe_token_dispatcher_type="allgather", add_bias_linear=False, bf16=False, params_dtype=torch.float32,
        moe_grouped_gemm=False, moe_router_score_function="sigmoid", moe_router_enable_expert_bias=True,
        moe_router_num_groups=4, moe_router_group_topk=2, moe_router_load_balancing_type="none",
        moe_router_dtype="fp32")
    fields.update(overrides)
    return TransformerConfig(**fields)


def build_model(config: TransformerConfig, seed: int = 7) -> GPTModel:
    """The tiny MLP-only MoE GPT (Megatron's local layer spec, CPUTopKRouter, no attention); expert biases set
    to random values so that a plain top-k of the router's scores would be wrong."""
    torch.manual_seed(seed)
    spec = get_gpt_layer_local_spec(num_experts=config.num_moe_experts, moe_grouped_gemm=False)
    spec.submodules.mlp.submodules.router = CPUTopKRouter
    spec.submodules.self_attention = IdentityOp
    spec.submodules.self_attn_bda = IdentityFuncOp
    spec.submodules.input_layernorm = IdentityOp
    model = GPTModel(config=config, transformer_layer_spec=spec, vocab_size=VOCAB, max_sequence_length=SEQ,
                     position_embedding_type="none")
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, TopKRouter) and module.expert_bias is not None:
                module.expert_bias.copy_(torch.randn(module.expert_bias.shape, generator=torch.Generator().manual_seed(seed)) * 0.05)
    return model


def moe_layers(model: torch.nn.Module) -> list[MoELayer]:
    """The model's MoE layers in layer order."""
    return [m for m in model.modules() if isinstance(m, MoELayer)]


@dataclass
class Captured:
    """What one MoE layer saw in one forward: its input hidden_states [S, B, H] and its weights then."""

    hidden_SBH: torch.Tensor
    state: dict[str, torch.Tensor]


@contextlib.contextmanager
def capture_moe_inputs(model: torch.nn.Module, into: dict[int, list[Captured]]):
    """Record every MoE layer's input and weights (by layer number) during the forwards inside the block.
    A forward inside autograd's backward (a recomputation) is not recorded: it is no new token."""
    handles = []
    for layer in moe_layers(model):
        def hook(module, args, number=layer.layer_number):
            if torch._C._current_graph_task_id() != -1:
                return
            state = {k: v.detach().clone() for k, v in module.state_dict().items() if isinstance(v, torch.Tensor)}
            into.setdefault(number, []).append(Captured(args[0].detach().clone(), state))
        handles.append(layer.register_forward_pre_hook(hook))
    try:
        yield into
    finally:
        for handle in handles:
            handle.remove()


def truth_counts(config: TransformerConfig, captured: list[Captured]) -> torch.Tensor:
    """int64 [E]: over the captured forwards of one layer on this rank, this rank's tokens whose MoE output
    changes when expert e's weights are zeroed, in a fresh MoELayer (never seen by the monitor) loaded with the
    weights of each forward. Never looks at the router's output. Under expert parallelism only the rank that
    holds expert e zeroes it, and every rank runs the layer (the dispatcher's collectives) and counts its own
    tokens: every rank must call this with as many captured forwards."""
    spec = get_gpt_layer_local_spec(num_experts=config.num_moe_experts, moe_grouped_gemm=False)
    spec.submodules.mlp.submodules.router = CPUTopKRouter
    layer = MoELayer(config, spec.submodules.mlp.submodules, layer_number=1)
    layer.eval()
    local = {expert: i for i, expert in enumerate(local_expert_ids(config))}
    truth = torch.zeros(config.num_moe_experts, dtype=torch.int64)
    with torch.no_grad():
        for seen in captured:
            layer.load_state_dict(seen.state, strict=False)

            def run(hidden_SBH: torch.Tensor = seen.hidden_SBH) -> torch.Tensor:
                out = layer(hidden_SBH)[0]
                return out.reshape(-1, out.shape[-1])

            base = run()
            assert torch.equal(base, run()), "the MoE layer must be deterministic for the truth to mean anything"
            for expert in range(config.num_moe_experts):
                params = list(layer.experts.local_experts[local[expert]].parameters()) if expert in local else []
                saved = [p.detach().clone() for p in params]
                for p in params:
                    p.zero_()
                truth[expert] += int((run() != base).any(dim=-1).sum())
                for p, s in zip(params, saved):
                    p.copy_(s)
    return truth


def local_expert_ids(config: TransformerConfig) -> list[int]:
    """The global ids of this rank's experts (Megatron: ep_rank * E / EP + i)."""
    ep = parallel_state.get_expert_model_parallel_world_size()
    per_rank = config.num_moe_experts // ep
    first = parallel_state.get_expert_model_parallel_rank() * per_rank
    return list(range(first, first + per_rank))


def batch(step: int, micro: int, rank: int = 0, micro_batch: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids [B, S], position_ids [B, S]) of one micro-batch, the same on every run."""
    gen = torch.Generator().manual_seed(1000 * step + 10 * micro + rank)
    ids = torch.randint(0, VOCAB, (micro_batch, SEQ), generator=gen)
    return ids, torch.arange(SEQ).expand(micro_batch, SEQ)


def train_iteration(model: GPTModel, optimizer: torch.optim.Optimizer, step: int, micro_batches: int = 2,
                    rank: int = 0) -> float:
    """One training iteration: forward + backward over every micro-batch (gradients accumulate), then one
    optimizer step. Returns the mean loss."""
    optimizer.zero_grad(set_to_none=True)
    total = 0.0
    for micro in range(micro_batches):
        ids, pos = batch(step, micro, rank)
        loss = model(ids, pos, attention_mask=None, labels=ids).float().mean() / micro_batches
        loss.backward()
        total += float(loss.detach())
    dp = parallel_state.get_data_parallel_world_size()
    if dp > 1:  # data parallel: average the shared weights' gradients (experts, allreduce False, are this rank's)
        group = parallel_state.get_data_parallel_group()
        for p in model.parameters():
            if p.grad is not None and getattr(p, "allreduce", True):
                dist.all_reduce(p.grad, group=group)
                p.grad /= dp
    optimizer.step()
    return total


def naive_topk_counts(config: TransformerConfig, captured: list[Captured]) -> torch.Tensor:
    """int64 [E]: what a plain top-k of the router's scores (no expert bias, no groups) would have counted: the
    wrong answer for the biased, group-limited router of tiny_config()."""
    counts = torch.zeros(config.num_moe_experts, dtype=torch.int64)
    for seen in captured:
        scores = torch.sigmoid(seen.hidden_SBH.reshape(-1, config.hidden_size) @ seen.state["router.weight"].T)
        ids = scores.topk(config.moe_router_topk, dim=1).indices
        counts += torch.bincount(ids.reshape(-1), minlength=config.num_moe_experts)
    return counts


def dp_worker(rank: int, world_size: int, port: int, redis_url: str, run: str, iterations: int, out_dir: str) -> None:
    """One rank of a data-parallel run (DP = world_size, EP = 1, gloo): trains `iterations` iterations with the monitor
    attached and publishing to redis_url, and writes its per-iteration ground truth [T, L, E] to
    out_dir/rank<r>.json (torch.multiprocessing.spawn target)."""
    import json

    from moe_monitor.collectors.megatron import attach_megatron

    init_parallel(rank, world_size, expert_parallel=1, port=port)
    try:
        config = tiny_config()
        model = build_model(config)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        monitor = attach_megatron(model, redis_url=redis_url, run=run, sample_tokens=4, nvml=False)
        truth_TLE = []
        for step in range(iterations):
            captured: dict[int, list[Captured]] = {}
            with capture_moe_inputs(model, captured), monitor.iteration():
                train_iteration(model, optimizer, step, rank=rank)
            truth_TLE.append([truth_counts(config, captured[n]).tolist() for n in monitor.layer_numbers])
        facts = {"truth_TLE": truth_TLE, "run": monitor.run, "parallel": dataclasses.asdict(monitor.parallel),
                 "gpus": monitor.meta.layout.gpus, "last_error": monitor.stats()["last_error"]}
        monitor.close()
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as handle:
            json.dump(facts, handle)
    finally:
        shutdown_parallel()


def ep_router_worker(rank: int, world_size: int, port: int, redis_url: str, run: str, iterations: int,
                     out_dir: str) -> None:
    """One rank of an expert-parallel run (EP = world_size, gloo) in which only the routers run: the model is built
    with EP = world_size (E / EP local experts per rank), but Megatron's dispatcher cannot gather tokens on the CPU
    (docs/megatron.md), so each iteration feeds every MoE layer's TopKRouter this rank's hidden states [S, B, H]
    directly, backpropagates a loss on its probs and steps an optimizer over the routers' weights. Saves what each
    router saw (Captured: its input and the MoE layer's weights) to out_dir/rank<r>.pt, {layer number: [..]} per
    iteration, for a ground truth computed later in a one-rank world."""
    from moe_monitor.collectors.megatron import attach_megatron

    init_parallel(rank, world_size, expert_parallel=world_size, port=port)
    try:
        config = tiny_config()
        model = build_model(config)
        layers = moe_layers(model)
        optimizer = torch.optim.AdamW([p for layer in layers for p in layer.router.parameters()], lr=1e-2)
        monitor = attach_megatron(model, redis_url=redis_url, run=run, sample_tokens=4, nvml=False)
        seen_T: list[dict[str, list[dict[str, torch.Tensor]]]] = []
        for step in range(iterations):
            seen: dict[str, list[dict[str, torch.Tensor]]] = {}
            with monitor.iteration():
                optimizer.zero_grad(set_to_none=True)
                for micro in range(2):
                    gen = torch.Generator().manual_seed(1000 * step + 10 * micro + rank)
                    for layer in layers:
                        hidden = torch.randn(SEQ, 2, config.hidden_size, generator=gen, requires_grad=True)
                        state = {k: v.detach().clone() for k, v in layer.state_dict().items()
                                 if k.startswith("router.")}
                        seen.setdefault(str(layer.layer_number), []).append({"hidden": hidden.detach().clone(),
                                                                             **state})
                        probs, _ = layer.router(hidden)
                        (probs.square().sum() * 1e-3).backward()
                optimizer.step()
            seen_T.append(seen)
        facts = {"run": monitor.run, "ep": monitor.parallel.ep, "ep_rank": monitor.parallel.ep_rank,
                 "gpus": monitor.meta.layout.gpus, "last_error": monitor.stats()["last_error"],
                 "local_experts": len(layers[0].experts.local_experts)}
        monitor.close()
        torch.save({"facts": facts, "seen_T": seen_T}, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        shutdown_parallel()


def captured_of(saved: list[dict[str, torch.Tensor]]) -> list[Captured]:
    """ep_router_worker's saved router inputs and weights as Captured forwards of a full MoE layer."""
    return [Captured(s["hidden"], {k: v for k, v in s.items() if k != "hidden"}) for s in saved]
