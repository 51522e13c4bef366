"""A tiny DeepSeek-V3 built by torchtitan's own builders, trained on the CPU, and a black-box truth of its routing.

The model: torchtitan.models.deepseek_v3 (MLA attention, node-limited sigmoid routing with torchtitan's
auxiliary-loss-free expert_bias, shared experts), shrunk to 3 MoE layers of 8 experts, top-2 of 2 of 4
groups. Attention is torchtitan's ScaledDotProductAttention, swapped in as torchtitan's graph_trainer tests do:
its FlexAttention default has no backward on the CPU ("FlexAttention does not support backward on CPU").

The truth never looks at the router: for every MoE layer, the input that layer got in the training forward is
kept (a forward pre-hook on the MoE module); after the iteration's backward and before the optimizer step
(the expert bias still the one the forward used), a twin MoE built from the same config, loaded with the
layer's state and hooked by nobody, runs that input once per expert with the expert's weights zeroed: the
tokens whose output changes are the tokens routed to that expert.
Shape legend: L MoE layers, E experts, B batch, S sequence, D model dim.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import torch
from torch import nn
from torchtitan.components.optimizer import default_adamw, register_moe_load_balancing_hook
from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC
from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm
from torchtitan.models.common.attention import ScaledDotProductAttention
from torchtitan.models.common.moe import MoE
from torchtitan.models.deepseek_v3 import build_mla_moe_layers
from torchtitan.models.deepseek_v3.model import DeepSeekV3Model
from torchtitan.models.deepseek_v3.sharding import set_deepseek_v3_sharding_config

NUM_EXPERTS, TOP_K, MOE_LAYERS, VOCAB, DIM = 8, 2, 3, 256, 64

_INIT = {"weight": partial(nn.init.trunc_normal_, std=0.02), "bias": nn.init.zeros_}
_ONES = {"weight": nn.init.ones_}


def _experts_init(layer_id: int) -> dict[str, Callable]:
    return {name: partial(nn.init.trunc_normal_, std=0.02) for name in ("w1_EFD", "w2_EDF", "w3_EFD")}


def tiny_config() -> DeepSeekV3Model.Config:
    """torchtitan's DeepSeek-V3 config, as its debugmodel flavor builds it, at toy sizes (1 dense + 3 MoE layers)."""
    rope_dim = 16
    layers = build_mla_moe_layers(
        n_layers=MOE_LAYERS + 1, n_dense_layers=1, dim=DIM, n_heads=4, q_lora_rank=0, kv_lora_rank=32,
        qk_nope_head_dim=16, qk_rope_head_dim=rope_dim, v_head_dim=16, mscale=0.70, dense_hidden_dim=128,
        moe_hidden_dim=32, num_experts=NUM_EXPERTS, num_shared_experts=1, router_top_k=TOP_K,
        router_score_func="sigmoid", router_num_expert_groups=4, router_num_limited_groups=2,
        router_route_norm=True, attn_backend="flex", moe_comm_backend="standard",
        non_blocking_capacity_factor=None, linear_init=_INIT, norm_init=_ONES, depth_init=lambda layer_id: _INIT,
        depth_experts_init=_experts_init,
        rope=ComplexRoPE.Config(dim=rope_dim, max_seq_len=256, theta=10000.0, scaling="yarn", rope_factor=40.0,
                                beta_fast=32.0, beta_slow=1.0, original_seq_len=64))
    for layer in layers:  # FlexAttention has no backward on the CPU
        layer.attention.inner_attention = ScaledDotProductAttention.Config()
    return DeepSeekV3Model.Config(
        vocab_size=VOCAB, dim=DIM, layers=layers,
        tok_embeddings=Embedding.Config(num_embeddings=VOCAB, embedding_dim=DIM, param_init=_INIT),
        norm=RMSNorm.Config(normalized_shape=DIM, param_init=_ONES),
        lm_head=Linear.Config(in_features=DIM, out_features=VOCAB, param_init=_INIT))


def build_model(seed: int = 0, ac: str = "none", expert_parallel: bool = False) -> nn.Module:
    """The tiny model on the CPU, initialised as torchtitan's trainer does (meta device, to_empty,
    init_weights); ac: "none", "full" (torchtitan's FullAC) or "selective" (SelectiveAC); expert_parallel:
    the sharding config torchtitan's trainer sets for expert_parallel_degree > 1 (parallelize it after)."""
    torch.manual_seed(seed)
    config = tiny_config()
    if expert_parallel:
        set_deepseek_v3_sharding_config(config, enable_sp=False, enable_ep=True)
    with torch.device("meta"):
        model = config.build()
    model.to_empty(device="cpu")
    model.init_weights(buffer_device=torch.device("cpu"))
    if ac == "full":
        FullAC(FullAC.Config()).apply(model)
    elif ac == "selective":
        SelectiveAC(SelectiveAC.Config()).apply(model)
    elif ac != "none":
        raise ValueError(f"ac must be none, full or selective, got {ac!r}")
    model.train()
    return model


def moe_modules(model: nn.Module) -> list[MoE]:
    return [module for module in model.modules() if isinstance(module, MoE)]


def build_optimizers(model: nn.Module, parallel_dims=None):
    """torchtitan's OptimizersContainer (AdamW) with its MoE load-balancing pre-hook (expert_bias updates; with
    parallel_dims, its token counts are summed over the ranks as torchtitan's trainer sums them)."""
    optimizers = default_adamw(lr=1e-2).build(model_parts=[model])
    register_moe_load_balancing_hook(optimizers, [model], parallel_dims or _NoParallel())
    return optimizers


class _NoParallel:
    """What _update_expert_bias asks of ParallelDims on one CPU rank: no mesh, no EP, no TP."""

    ep_enabled, tp = False, 1

    def get_optional_mesh(self, name: str) -> None:
        return None


@dataclass
class RoutingTruth:
    """Captures each MoE layer's inputs of an iteration and turns them into black-box counts.
    counts_LE: int64 [L, E], every iteration's truth summed; step_counts: one [L, E] per iteration."""

    model: nn.Module
    counts_LE: torch.Tensor = field(init=False)
    step_counts: list[torch.Tensor] = field(default_factory=list)
    calls_L: list[int] = field(init=False)  # every forward of each MoE module, recomputations included
    capturing: bool = False  # set by train() around the model's forward only (never during backward)

    def __post_init__(self) -> None:
        self.moes = moe_modules(self.model)
        self.counts_LE = torch.zeros(len(self.moes), NUM_EXPERTS, dtype=torch.int64)
        self.calls_L = [0] * len(self.moes)
        self._inputs: list[list[torch.Tensor]] = [[] for _ in self.moes]
        self._twin = tiny_config().layers[1].moe.build()
        self._handles = [moe.register_forward_pre_hook(partial(self._keep, index))
                         for index, moe in enumerate(self.moes)]

    def _keep(self, index: int, module: nn.Module, args: tuple) -> None:
        self.calls_L[index] += 1
        if self.capturing:  # the forward itself, not AC's recomputation in backward
            self._inputs[index].append(args[0].detach().clone())

    def close_iteration(self) -> torch.Tensor:
        """int64 [L, E] of the iteration's forwards; call after backward, before the optimizer step (on every
        rank at once when the layers are sharded: their full weights are gathered)."""
        step = torch.zeros_like(self.counts_LE)
        for index, moe in enumerate(self.moes):
            self._twin.load_state_dict({name: value.full_tensor() if hasattr(value, "full_tensor") else value
                                        for name, value in moe.state_dict().items()})
            for x_BSD in self._inputs[index]:
                step[index] += expert_truth(self._twin, x_BSD)
            self._inputs[index].clear()
        self.counts_LE += step
        self.step_counts.append(step)
        return step

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()


@torch.no_grad()
def expert_truth(moe: MoE, x_BSD: torch.Tensor) -> torch.Tensor:
    """int64 [E]: the tokens of x_BSD whose MoE output changes when expert e's weights are zeroed (eval mode:
    the twin's tokens_per_expert_E is left alone)."""
    moe.eval()
    experts = moe.routed_experts.inner_experts
    weights = [experts.w1_EFD, experts.w2_EDF, experts.w3_EFD]
    base_TD = moe(x_BSD).reshape(-1, x_BSD.shape[-1])
    if not torch.equal(base_TD, moe(x_BSD).reshape(-1, x_BSD.shape[-1])):
        raise AssertionError("the MoE block must be deterministic for the truth to mean anything")
    truth_E = torch.zeros(NUM_EXPERTS, dtype=torch.int64)
    for expert in range(NUM_EXPERTS):
        saved = [w.data[expert].clone() for w in weights]
        for w in weights:
            w.data[expert].zero_()
        changed_T = (moe(x_BSD).reshape(-1, x_BSD.shape[-1]) != base_TD).any(dim=-1)
        for w, s in zip(weights, saved):
            w.data[expert].copy_(s)
        truth_E[expert] = int(changed_T.sum())
    return truth_E


def train(model: nn.Module, optimizers, iterations: int, micro_batches: int, batch: int = 2, seq: int = 16,
          seed: int = 1, truth: RoutingTruth | None = None,
          before_step: Callable[[], None] | None = None) -> int:
    """Real training iterations: micro_batches forward+backward passes (cross-entropy on random tokens, gradient
    accumulation), then the optimizer step (torchtitan's expert-bias pre-hook, then AdamW). Returns the tokens
    trained on. truth: closed after each iteration's backward passes, before the step; before_step() then too."""
    generator = torch.Generator().manual_seed(seed)
    tokens_total = 0
    for _ in range(iterations):
        for _ in range(micro_batches):
            tokens_BS = torch.randint(0, VOCAB, (batch, seq), generator=generator)
            if truth is not None:
                truth.capturing = True
            logits_BSV = model(tokens_BS[:, :-1])
            if truth is not None:
                truth.capturing = False
            loss = nn.functional.cross_entropy(logits_BSV.reshape(-1, VOCAB).float(), tokens_BS[:, 1:].reshape(-1))
            (loss / micro_batches).backward()
            tokens_total += tokens_BS[:, :-1].numel()
        if truth is not None:
            truth.close_iteration()
        if before_step is not None:
            before_step()
        optimizers.step()
        optimizers.zero_grad()
    return tokens_total


def rank_worker(rank: int, world: int, expert_parallel: int, port: int, redis_url: str, run: str,
                out_dir: str) -> None:
    """One rank of a gloo job (torch.multiprocessing.spawn): torchtitan's ParallelDims (FSDP over every rank,
    expert parallel of degree expert_parallel), parallelize_deepseekv3, two training iterations of two
    micro-batches with the collector attached; writes its truth to out_dir/truth{rank}.pt.

    Two CPU adaptations, both outside the MoE: torchtitan 0.3.0 takes device_type "cuda" when no accelerator
    is present (tools/utils.get_device_info), so its meshes are built for "cpu" here; and gloo has no
    ReduceOp.PREMUL_SUM (FSDP's reduce-scatter with the gradient divide factor 1 torchtitan sets), so the FSDP
    modules reduce with a plain sum (set_force_sum_reduction_for_comms, the same gradients)."""
    import os

    import torch.distributed as dist
    import torchtitan.distributed.parallel_dims as parallel_dims_module
    from torch.distributed.fsdp import FSDPModule
    from torchtitan.config import CompileConfig, ParallelismConfig, TrainingConfig
    from torchtitan.distributed import ParallelDims
    from torchtitan.distributed import utils as dist_utils
    from torchtitan.models.deepseek_v3.parallelize import parallelize_deepseekv3

    from moe_monitor.collectors.torchtitan import attach

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), LOCAL_RANK=str(rank))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        parallel_dims_module.device_type = "cpu"
        dist_utils.set_spmd_backend("partial_dtensor")
        parallel_dims = ParallelDims(dp_replicate=1, dp_shard=world, cp=1, tp=1, pp=1, ep=expert_parallel,
                                     world_size=world, spmd_backend="partial_dtensor")
        parallel_dims.build_mesh()
        model = build_model(seed=0, expert_parallel=expert_parallel > 1)
        model = parallelize_deepseekv3(
            model, parallel_dims=parallel_dims,
            training=TrainingConfig(mixed_precision_param="float32", mixed_precision_reduce="float32"),
            parallelism=ParallelismConfig(spmd_backend="partial_dtensor", expert_parallel_degree=expert_parallel,
                                          data_parallel_shard_degree=world),
            compile_config=CompileConfig(), ac_config=None, dump_folder="")
        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.set_force_sum_reduction_for_comms(True)
        optimizers = build_optimizers(model, parallel_dims)
        truth = RoutingTruth(model)
        monitor = attach(model, redis_url, run=run, optimizers=optimizers, parallel_dims=parallel_dims)
        try:
            train(model, optimizers, iterations=2, micro_batches=2, seed=10 + rank, truth=truth)
        finally:
            monitor.close()
            truth.remove()
        replica_rule = _replica_rule(world)
        dispatchers = {f"{type(moe.routed_experts.token_dispatcher).__name__} ep_mesh="
                       f"{getattr(moe.routed_experts.token_dispatcher, 'ep_mesh', None) is not None}"
                       for moe in truth.moes}
        torch.save({"counts": truth.step_counts, "parallel": monitor.parallel, "rank": monitor.rank,
                    "dispatchers": sorted(dispatchers), "replica_rule": replica_rule,
                    "world": monitor.world_size, "hook_errors": monitor.stats()["hook_errors"]},
                   os.path.join(out_dir, f"truth{rank}.pt"))
    finally:
        dist.destroy_process_group()


def _replica_rule(world: int) -> dict[str, list[int] | None]:
    """What the collector counts of router ids that are DTensors on a 1-D mesh of every rank: the local shard's
    shape of Shard(0) ids, and of Replicate() ids (None: left to the rank at coordinate 0)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    from moe_monitor.collectors.torchtitan import _local_ids

    mesh = init_device_mesh("cpu", (world,))
    ids_TK = torch.arange(4 * world * TOP_K).view(4 * world, TOP_K) % NUM_EXPERTS
    shown = {}
    for name, placement in (("shard", Shard(0)), ("replicate", Replicate())):
        local = _local_ids(distribute_tensor(ids_TK, mesh, [placement]))
        shown[name] = None if local is None else list(local.shape)
    return shown
