"""Optimizer CPU offload (Megatron-Core ``--optimizer-cpu-offload`` with
``--optimizer-offload-fraction 1.0``; DeepSpeed ZeRO-Offload, Ren et al. 2021, arXiv 2101.06840):
the FP32 master weights and AdamW moments live in host memory, the device sends its gradient shard
down over PCIe, the host runs Adam over that shard, and the updated parameters come back up.

The step pays, per parameter of the rank's optimizer shard (serially: the overlap of
Megatron's ``--overlap-cpu-optimizer-d2h-h2d`` is not modelled, an upper bound on the time):

* the host Adam, memory-bandwidth bound: Adam's update (Kingma & Ba 2015, Algorithm 1) reads the
  FP32 master, gradient and two moments (16 B) and writes the master and moments back (12 B):
  :data:`HOST_ADAM_BYTES` = 28 B over the device's share of host memory bandwidth
  (:attr:`dayzero.specs.host.HostSpec.memory_bw`, the cluster's);
* the gradient down (``grad_bytes``, FP32 as it is reduced) and the BF16 parameter up (2 B) over
  the host link (:attr:`~dayzero.specs.host.HostSpec.link_bw`; ZeRO-Offload sec. 4.1: gradients
  offloaded to CPU memory, the updated parameters copied back to the GPU).
"""

from __future__ import annotations

import numpy as np

from dayzero.specs.host import HOST_MEMORY_BW_PER_DEVICE, HOST_MEMORY_PER_DEVICE, PCIE_GEN5_X16_BW  # noqa: F401

# Adam per parameter in host memory: read master, grad, exp_avg, exp_avg_sq (4 x 4 B), write
# master, exp_avg, exp_avg_sq (3 x 4 B) (Kingma & Ba 2015, Algorithm 1; FP32 states as Megatron's
# HybridDeviceOptimizer keeps them on the CPU)
HOST_ADAM_BYTES = 28
PARAM_UP_BYTES = 2  # the updated BF16 working parameter copied back to the device
# The host link and host DRAM bandwidth are the cluster's (Cluster.host, dayzero.specs.host: a DGX H100's
# PCIe Gen5 x16 and 76.8 GB/s, an Atlas 800T A2's PCIe 4.0 x16 and 102.4 GB/s, a GB200 superchip's
# NVLink-C2C share); the DGX H100 figures imported above (specs.host.FALLBACK) are the defaults here, the
# documented fallback for a host no document states.


def offloaded_optimizer_s(shard_params, grad_bytes: float, host_link_bw: float = PCIE_GEN5_X16_BW,
                          host_memory_bw: float = HOST_MEMORY_BW_PER_DEVICE) -> np.ndarray:
    """Seconds per step of an offloaded optimizer step over ``shard_params`` parameters per device:
    the host Adam plus the gradient down and the parameter up, one after the other."""
    shard = np.asarray(shard_params, dtype=float)
    return shard * HOST_ADAM_BYTES / host_memory_bw + shard * (grad_bytes + PARAM_UP_BYTES) / host_link_bw


HOST_GRAD_BYTES = 4  # the FP32 gradient copy the host Adam reads (Megatron's HybridDeviceOptimizer keeps
# CPU FP32 copies of each offloaded parameter and of its .grad: megatron/core/optimizer/cpu_offloading/
# hybrid_optimizer.py; ZeRO-Offload sec. 4.1: gradients are offloaded to CPU memory)


def host_bytes(stage_optimizer_bytes, master_bytes: float, moment_bytes: float) -> float:
    """Host memory one device's offloaded optimizer takes: its FP32 master, moments and FP32 gradient
    copy, from the optimizer bytes its busiest stage would keep on the device without offload
    (``stage_optimizer_bytes``: master + moments per state, MemoryOptions.master_bytes / optim_bytes)."""
    if master_bytes + moment_bytes <= 0:
        return 0.0
    states = max(np.asarray(stage_optimizer_bytes, dtype=float).max(initial=0.0), 0.0) / (master_bytes + moment_bytes)
    return states * (master_bytes + moment_bytes + HOST_GRAD_BYTES)
