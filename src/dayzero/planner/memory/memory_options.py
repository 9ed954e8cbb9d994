"""MemoryOptions: every bytes-per-element and overhead term of the memory model, overridable.

Defaults follow Megatron-LM mixed precision with the distributed optimizer: BF16 parameters (2 B),
FP32 gradient accumulation buffer (``main_grad``, 4 B), FP32 master weights (4 B) and two FP32
AdamW moments (8 B): 18 B/param, of which 12 B are sharded by ZeRO-1 ("6 + 12/dp",
Megatron-LM docs, distributed optimizer). The ZeRO paper (Rajbhandari et al. 2020, sec. 3.1)
counts FP16 gradients instead: ``MemoryOptions(grad_bytes=2)`` gives its 16 B/param (K = 12).
Sources for every default are in docs/memory.md.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

import numpy as np

from dayzero.errors import ConfigError

MiB = 2**20
# Bytes per parameter of AdamW's two moments (exp_avg + exp_avg_sq), by their dtype: FP32 is
# Megatron-LM's default; BF16 is DeepSeek-V3's (arXiv 2412.19437, sec. 3.3.3, "Low-Precision
# Optimizer States": "we adopt the BF16 data format instead of FP32 to track the first and second
# moments in the AdamW optimizer"; master weights and gradients stay FP32) and Megatron-LM's
# --use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16
MOMENT_BYTES = {"fp32": 8, "bf16": 4}
# Bytes per element of an FP8 tensor (E4M3 / E5M2), as FP8 parameter storage keeps the GEMM weights
FP8_BYTES = 1
# What an attention kernel keeps for its backward: fused kernels (cuDNN, FlashAttention 2/3) the
# log-sum-exp per row; unfused attention (plain matmul + softmax) the s x s probabilities
# (Korthikanti et al. 2022, sec. 4.1: the 5as^2/t term disappears only with a fused kernel).
KERNEL_MEMORY = {"fused": "flash", "flash2": "flash", "unfused": "eager"}
# Fragmentation budget by allocator mode, as a fraction of the activation and temporary bytes:
# the mean slack (reserved - allocated when the reservation peaks, over those bytes) of the
# one-step allocator replay (planner/memory/replay.py) of the busiest stage of every shipped published
# run it replays (447 layouts: benchmarks/bench_fragmentation.py, benchmarks/RESULTS_memory.md).
# Caching allocator: 9.9 % (1.3 % median without recompute or ZeRO-3, 12 % with), the order of
# GMLake's measurement of PyTorch's caching allocator on eight LLMs under recompute / ZeRO /
# offload (Guo et al., ASPLOS 2024, arXiv 2401.08156: 15 % on average, up to 33 %, removed by
# virtual-memory stitching). Expandable segments (pytorch/pytorch#96995, the same CUDA VMM
# mechanism): 1.6 % (at most 3.3 % without recompute or ZeRO-3).
FRAGMENTATION = {"caching": 0.10, "expandable": 0.016}
# Device memory the NVIDIA driver never exposes: nvidia-smi shows 81559 MiB total on an
# "H100 80GB HBM3" (80 GiB = 81920 MiB), 361 MiB less (specs.hardware.HBM_GB).
NVIDIA_DRIVER_RESERVED = 1 - 81559 / 81920


def check_attention_kernel(kernel: str) -> None:
    """``--attention-kernel`` names one of :data:`KERNEL_MEMORY`'s kernels."""
    from dayzero.errors import ConfigError

    if kernel not in KERNEL_MEMORY:
        raise ConfigError("--attention-kernel", None, f"must be {', '.join(KERNEL_MEMORY)}, got {kernel!r}")


@dataclass(frozen=True)
class MemoryOptions:
    # -- model states (bytes per parameter element) ---------------------------------------------
    param_bytes: int = 2  # BF16 working weights
    grad_bytes: int = 4  # FP32 gradient buffer (Megatron main_grad; torchtitan reduce_dtype=fp32)
    master_bytes: int = 4  # FP32 master weights (0 when training in FP32: the param is the master)
    # AdamW exp_avg + exp_avg_sq in FP32; 4 in BF16 (MOMENT_BYTES["bf16"]), as DeepSeek-V3 trains
    optim_bytes: int = 8
    fp8_weight_cache_bytes: int = 2  # FP8 weight + transpose cached across micro-batches (TE)
    # FP8 parameter storage under an FP8 recipe (Megatron-LM --fp8-param-gather, arguments.py: "Keep
    # the compute param in fp8 (do not use any other intermediate dtype) and perform the param
    # all-gather in fp8"; Transformer Engine fp8_model_init: modules "hold only FP8 copies of its
    # parameters, as opposed to the default behavior where both higher precision and FP8 copies are
    # present ... useful for ... training using optimizer with master weights"). The decoder layers'
    # weights take FP8_BYTES instead of param_bytes and the FP8 weight cache keeps only what is not
    # the weight itself: the transpose (fp8_weight_cache_bytes - FP8_BYTES; TE's Float8Tensor caches
    # it because Hopper's FP8 GEMMs take only the TN layout, MXFP8 keeps columnwise data alike).
    # The embedding and head (not FP8 GEMMs in TE recipes) and the FP32 master stay as they were.
    # Approximation: the decoder layers' norm and router vectors count as FP8 too (O(h) of O(h^2)).
    fp8_params: bool = False
    # Optimizer CPU offload (Megatron-Core --optimizer-cpu-offload, --optimizer-offload-fraction 1.0;
    # ZeRO-Offload, arXiv 2101.06840): the FP32 master weights and the moments live in host memory,
    # none on the device (planner.memory.offload times the host step); gradients and weights stay
    optimizer_offload: bool = False
    # Activation CPU offload (Megatron-Core --cpu-offloading --cpu-offloading-num-layers N, TE
    # get_cpu_offload_context): the saved activations of the first N layers of each model chunk
    # live in host memory between their forward and backward (planner.memory.activation_offload; the
    # time side is PerfOptions.activation_offload_layers); 0: off
    activation_offload_layers: int = 0

    # -- activations -----------------------------------------------------------------------------
    act_bytes: int = 2  # BF16 saved activations
    fp8_act_bytes: int = 1  # inputs of linear layers saved in FP8 under --precision fp8 (TE)
    # Under FP8 training, also cache the activation function's (SwiGLU's) inputs in FP8: Megatron-LM
    # --activation-func-fp8-input-store (transformer_config.py activation_func_fp8_input_store:
    # "Store the input of MLP activation function in FP8 for backprop to save memory"); DeepSeek-V3
    # (arXiv 2412.19437, sec. 3.3.3, "Inputs of the SwiGLU operator in MoE"): "These activations are
    # also stored in FP8 with our fine-grained quantization method"
    act_func_fp8_input: bool = False
    attention: Literal["flash", "eager"] = "flash"  # eager materialises the a*s*s score matrix
    # fused: norms and gated activations as fused kernels (Megatron/TE: a norm saves its input, a
    # SwiGLU its two inputs); eager: plain PyTorch ops as dayzero's runtime runs them, which also
    # save each norm's fp32 normalised copy and the activation's output (docs/validation.md)
    kernels: Literal["fused", "eager"] = "fused"
    # FSDP2 mixed precision (torchtitan, dayzero's runtime) keeps sharded parameters in fp32, as
    # the master weights, and gathers compute-dtype copies only for use: under ZeRO-3 there is no
    # separate sharded working copy (Megatron's distributed optimizer keeps one)
    sharded_params_are_master: bool = False
    # The ZeRO stages run as FSDP under torch.distributed.pipelining (torchtitan, dayzero's
    # runtime: planner.engines.pipelined_fsdp): with pp > 1 such a stage keeps its parameters
    # gathered and its gradients unsharded in reduce_dtype from its first backward to the step's
    # end, where one reduce-scatter runs (planner.schedule.held_zero has the sources): ZeRO-1's
    # weights and gradients, the optimizer states sharded as laid out. (): as laid out
    pipelined_fsdp: tuple[int, ...] = ()
    dropout: bool = False  # Korthikanti's GPT keeps dropout masks (1 B/elem); modern LLMs train without
    moe_capacity_factor: float = 1.0  # routed tokens per expert / balanced share (1.0: dropless, balanced)
    # Where the routing weights multiply the routed tokens. "activation": Megatron-Core's grouped
    # experts fold them into the SwiGLU (megatron/core/transformer/moe/experts.py TEGroupedMLP
    # bias_act_func -> weighted_bias_swiglu_impl(intermediate, bias, permuted_probs), fusions/
    # fused_bias_swiglu.py), whose backward needs only the SwiGLU input (kept anyway) and the
    # weights, and the combine is an unweighted sum that keeps nothing. "combine": the weights
    # scale each expert's output in the combine (GShard-style; torchtitan with
    # score_before_experts=False; dayzero's runtime, kernels="eager"), whose backward needs every
    # expert output: 2 B x routed rows x hidden per MoE layer (activations.mlp_terms expert_out).
    # The default stays "combine" (the model before this option): "activation" moves 35 published
    # MoE rows with blank recompute from full to no recompute, in-sample MAPE 9.26 -> 9.03 %, MoE
    # leave-one-group-out 12.9 -> 11.9 %, but the overall leave-one-group-out 9.72 -> 9.76 %
    # (benchmarks/RESULTS.md, 2026-12-03)
    moe_probs: Literal["activation", "combine"] = "combine"
    logits_bytes: int = 4  # FP32 logits for the loss (Megatron upcasts before vocab-parallel CE)

    # -- transient buffers -----------------------------------------------------------------------
    zero3_prefetch_units: int = 2  # gathered units in flight under ZeRO-3: current + prefetched layer
    grad_bucket_params: int | None = None  # DP bucket; None: Megatron's max(40M, 1M * dp) elements
    grad_buckets_in_flight: int = 2  # one filling while the previous one is reduce-scattered

    # -- overhead --------------------------------------------------------------------------------
    runtime_context_bytes: int = 723 * MiB  # CUDA/CANN context + kernel images, before any tensor
    comm_buffer_bytes: int = 688 * MiB  # per communicator this rank uses (NCCL, A100 measurement)
    # Allocator slack, as a fraction of the churning (activation and temporary) bytes; None: the
    # allocator mode's budget (:data:`FRAGMENTATION`)
    fragmentation: float | None = None
    # PyTorch's allocator mode: "caching" (the default) or "expandable"
    # (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, as torchtitan's run_train.sh launches;
    # planner.memory.allocator replays both)
    allocator: Literal["caching", "expandable"] = "caching"
    reserved_fraction: float = 0.0  # device memory the driver keeps back, fraction of capacity

    def __post_init__(self):
        for name in ("param_bytes", "grad_bytes", "master_bytes", "optim_bytes", "act_bytes", "fp8_act_bytes",
                     "logits_bytes", "fp8_weight_cache_bytes", "runtime_context_bytes", "comm_buffer_bytes"):
            if getattr(self, name) < 0:
                raise ConfigError("memory options", name, f"must be >= 0, got {getattr(self, name)}")
        if self.kernels not in ("fused", "eager"):
            raise ConfigError("memory options", "kernels", f"must be fused|eager, got {self.kernels!r}")
        if self.moe_probs not in ("activation", "combine"):
            raise ConfigError("memory options", "moe_probs", f"must be activation|combine, got {self.moe_probs!r}")
        if self.allocator not in ("caching", "expandable"):
            raise ConfigError("memory options", "allocator", f"must be caching|expandable, got {self.allocator!r}")
        if self.attention not in ("flash", "eager"):
            raise ConfigError("memory options", "attention", f"must be flash|eager, got {self.attention!r}")
        if not 0 <= self.fragmentation_budget < 1 or not 0 <= self.reserved_fraction < 1:
            raise ConfigError("memory options", "fragmentation", "fragmentation and reserved_fraction must be in [0, "
                                                                 "1), "
                              f"got {self.fragmentation} and {self.reserved_fraction}")
        if self.activation_offload_layers < 0:
            raise ConfigError("--activation-offload", None,
                              f"must be >= 0 layers per model chunk (0: off), got {self.activation_offload_layers}")
        if any(z not in (0, 1, 2, 3) for z in self.pipelined_fsdp):
            raise ConfigError("memory options", "pipelined_fsdp", f"ZeRO stages 0-3, got {self.pipelined_fsdp!r}")
        if not 0 < self.moe_capacity_factor < float("inf"):
            raise ConfigError("memory options", "moe_capacity_factor", f"must be > 0, got {self.moe_capacity_factor}")

    @property
    def fragmentation_budget(self) -> float:
        """The fragmentation budget in force: the explicit one, else the allocator mode's."""
        if self.fragmentation is not None:
            return self.fragmentation
        return FRAGMENTATION.get(self.allocator, FRAGMENTATION["caching"])

    @property
    def bytes_per_param(self) -> int:
        """Model-state bytes per parameter before any sharding (18 by default, 16 for the ZeRO paper)."""
        return self.param_bytes + self.grad_bytes + self.master_bytes + self.optim_bytes

    def layer_param_bytes(self, fp8, stored=False):
        """Bytes per decoder-layer working weight: FP8_BYTES under FP8 parameter storage (these
        options' ``fp8_params``, or the layout's ``stored``: ParallelConfig.fp8_param_gather, bool or
        array per candidate) and an FP8 recipe (``fp8``: bool or array per candidate), else
        ``param_bytes``."""
        return np.where(np.asarray(fp8) & (self.fp8_params | np.asarray(stored, dtype=bool)), FP8_BYTES,
                        self.param_bytes)

    def fp8_cache_bytes(self, fp8, stored=False):
        """Bytes per decoder-layer parameter of the FP8 weight cache: 0 without an FP8 recipe, the
        transpose only under FP8 parameter storage (``stored`` as in :meth:`layer_param_bytes`: the
        weight is its own FP8 copy)."""
        fp8 = np.asarray(fp8)
        on = fp8 & (self.fp8_params | np.asarray(stored, dtype=bool))
        return np.where(fp8, self.fp8_weight_cache_bytes - np.where(on, FP8_BYTES, 0), 0)

    def with_(self, **kw) -> "MemoryOptions":
        return replace(self, **kw)

    @classmethod
    def for_run(cls, accelerator, attention_kernel: str = "fused", engine=None, **kw) -> "MemoryOptions":
        """Defaults for an accelerator, the attention kernel the step runs (:data:`KERNEL_MEMORY`:
        what compute assumes, memory assumes too) and the engine (``engine``: a name of
        planner.engines, whose memory :func:`dayzero.planner.engines.pipelined_fsdp` says; None:
        the sharding as laid out, the ZeRO paper's arithmetic)."""
        from dayzero.planner.engines import pipelined_fsdp

        check_attention_kernel(attention_kernel)
        kw.setdefault("attention", KERNEL_MEMORY[attention_kernel])
        kw.setdefault("pipelined_fsdp", pipelined_fsdp(engine) if engine else ())
        return cls.for_accelerator(accelerator, **kw)

    @classmethod
    def for_accelerator(cls, accelerator, **kw) -> "MemoryOptions":
        """Defaults for a vendor's communication library: HCCL reserves 2 x HCCL_BUFFSIZE (200 MB
        by default) per communicator (CANN docs, HCCL_BUFFSIZE); NCCL's footprint is measured at
        544-688 MiB per communicator on A100 (NVIDIA/nccl#964)."""
        vendor = getattr(accelerator, "vendor", "") or ""
        if vendor.lower().startswith("nvidia"):  # nvidia-smi: 81559 of 81920 MiB on an H100 80GB HBM3
            kw.setdefault("reserved_fraction", NVIDIA_DRIVER_RESERVED)
        if vendor.lower().startswith("huawei"):
            kw.setdefault("comm_buffer_bytes", 2 * 200 * 10**6)
        # a calibrated profile (dayzero calibrate) measured these on the machine itself
        for name in ("runtime_context_bytes", "comm_buffer_bytes"):
            if getattr(accelerator, name, None) is not None:
                kw.setdefault(name, getattr(accelerator, name))
        return cls(**kw)
