"""Microbenchmarks of the machine, run on every rank at once (``run_rank``, one process per rank).

All ranks measure at the same time, so each figure is what one rank gets while its peers work
too: on a GPU node that is one GPU's rate; on a CPU host with more ranks than cores it is each
rank's share of the cores, which is what a training job on that host sees.

* **GEMM**: ``a @ b`` for square and model-shaped (m, k, n) in each dtype; 2mkn FLOPs.
* **Memory bandwidth**: the STREAM triad ``a = b + s * c`` (McCalpin 1995, "Memory Bandwidth
  and Machine Balance in Current High Performance Computers"): 3 x 4 bytes per fp32 element.
* **Attention**: ``scaled_dot_product_attention`` (causal) forward and forward + backward; the
  FLOPs the planner counts, b h s (s + 1) (d + dv) forward.
* **Collectives** through torch.distributed: all-reduce, all-gather, reduce-scatter,
  all-to-all over groups of 2, 4, ... consecutive ranks (every such group of the world at once,
  as tensor-parallel groups run), and send/recv between neighbour pairs, by message size.
  Seconds per op are the slowest rank's; sizes follow nccl-tests (doc/PERFORMANCE.md): the
  whole buffer for all-gather / reduce-scatter / all-to-all, the message for send/recv.
* **Memory overhead**: the resident bytes of a rank after joining the process group, before
  any tensor (CPU), or the device memory the runtime context and communicators take (accelerator).

Timing: one warm-up, then enough iterations for ``min_time_s``, ``trials`` times; the median.
"""

from __future__ import annotations

import platform
import resource
import statistics
import time

DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def plan(device_type: str, world: int, quick: bool = False) -> dict:
    """What to measure on this kind of device (sizes chosen to finish in ~1 min on a CPU host,
    larger on any accelerator)."""
    if device_type != "cpu":
        squares = [256, 512, 1024, 2048, 4096, 8192]
        shapes = [(d, d, d) for d in squares] + [(8192, 4096, 14336), (8192, 14336, 4096), (4096, 8192, 1024)]
        gemm = {"bf16": shapes, "fp32": [(d, d, d) for d in squares[:5]]}
        sizes = [2**k for k in range(12, 31, 2)]  # 4 KiB .. 1 GiB
        attention = [(4, 32, 4096, 128)]
        triad_elems, min_time, trials = 2**28, 0.05, 5
    else:
        squares = [64, 128, 256, 512] if quick else [64, 128, 256, 384, 512, 768]
        shapes = [(d, d, d) for d in squares] + ([] if quick else [(512, 256, 704), (512, 704, 256), (1024, 256, 64)])
        gemm = {"fp32": shapes, "bf16": [(d, d, d) for d in squares[:4]]}
        sizes = [2**k for k in (12, 16, 20, 22)] if quick else [2**k for k in (10, 12, 14, 16, 18, 20, 22, 24)]
        attention = [(1, 4, 256, 32)] if quick else [(1, 4, 256, 64), (2, 8, 512, 32)]
        triad_elems, min_time, trials = 2**22, 0.02 if quick else 0.05, 3
    groups = [g for g in (2, 4, 8, 16, 32, 64) if g <= world and world % g == 0]
    return {"gemm": gemm, "collective_bytes": sizes, "groups": groups, "attention": attention,
            "triad_elems": triad_elems, "min_time_s": min_time, "trials": trials}


def _sync(device):
    from dayzero.runtime.device import synchronize

    synchronize(device)


def _time_local(fn, device, min_time: float, trials: int) -> float:
    """Median seconds per call of ``fn`` on this rank."""
    fn()
    _sync(device)
    t0 = time.perf_counter()
    fn()
    _sync(device)
    one = max(time.perf_counter() - t0, 1e-7)
    iters = max(1, int(min_time / one))
    samples = []
    from dayzero.runtime.device import Timer

    timer = Timer(device)  # device events on an accelerator, a synchronised wall clock on CPU
    for _ in range(trials):
        timer.start()
        for _ in range(iters):
            fn()
        samples.append(timer.stop() / iters)
    return statistics.median(samples)


def _time_collective(fn, device, min_time: float, trials: int) -> float:
    """Median over trials of the slowest rank's seconds per op (every rank agrees on the
    iteration count, so the collectives line up)."""
    import torch
    import torch.distributed as dist

    fn()
    _sync(device)
    dist.barrier()
    t0 = time.perf_counter()
    fn()
    _sync(device)
    one = torch.tensor([time.perf_counter() - t0], dtype=torch.float64, device=device)
    dist.all_reduce(one, op=dist.ReduceOp.MAX)
    iters = max(1, min(200, int(min_time / max(float(one), 1e-7))))
    samples = []
    for _ in range(trials):
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        _sync(device)
        t = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        samples.append(float(t))
    return statistics.median(samples)


def gemm(device, p: dict) -> list[dict]:
    import torch
    import torch.distributed as dist

    out = []
    for dt, shapes in p["gemm"].items():
        dtype = getattr(torch, DTYPES[dt])
        for m, k, n in shapes:
            a = torch.randn(m, k, device=device).to(dtype)
            b = torch.randn(k, n, device=device).to(dtype)
            dist.barrier()
            s = _time_local(lambda: a @ b, device, p["min_time_s"], p["trials"])
            out.append({"dtype": dt, "m": m, "k": k, "n": n, "seconds": s, "tflops": 2 * m * k * n / s / 1e12})
    return out


def triad(device, p: dict) -> list[dict]:
    import torch
    import torch.distributed as dist

    n = p["triad_elems"]
    a, b, c = (torch.rand(n, device=device) for _ in range(3))
    dist.barrier()
    s = _time_local(lambda: torch.add(b, c, alpha=1.5, out=a), device, p["min_time_s"], p["trials"])
    return [{"op": "triad", "bytes": 3 * 4 * n, "seconds": s, "gbytes_per_s": 3 * 4 * n / s / 1e9}]


def attention(device, p: dict, dtypes=("fp32", "bf16")) -> list[dict]:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    out = []
    for dt in dtypes if device.type == "cpu" else ("bf16",):
        dtype = getattr(torch, DTYPES[dt])
        for b, h, s, d in p["attention"]:
            q, k, v = (torch.randn(b, h, s, d, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
            grad = torch.randn(b, h, s, d, device=device, dtype=dtype)

            def fwd():
                with torch.no_grad():
                    F.scaled_dot_product_attention(q, k, v, is_causal=True)

            def fwd_bwd():
                o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                o.backward(grad)

            dist.barrier()
            tf = _time_local(fwd, device, p["min_time_s"], p["trials"])
            tfb = _time_local(fwd_bwd, device, p["min_time_s"], p["trials"])
            flops = b * h * s * (s + 1) * (d + d)  # causal QK^T and PV (specs.counting.attention_flops_per_token)
            out.append({"dtype": dt, "batch": b, "heads": h, "seq": s, "head_dim": d, "fwd_s": tf, "fwd_bwd_s": tfb,
                        "fwd_flops": flops})
    return out


def collectives(device, p: dict) -> list[dict]:
    import torch
    import torch.distributed as dist

    world, rank = dist.get_world_size(), dist.get_rank()
    out = []
    for g in p["groups"]:
        # every rank creates every group, in the same order; each rank keeps its own
        mine = None
        for start in range(0, world, g):
            grp = dist.new_group(list(range(start, start + g)))
            if start <= rank < start + g:
                mine = grp
        for nbytes in p["collective_bytes"]:
            elems = max(g, nbytes // 4 // g * g)
            full = torch.ones(elems, device=device)
            part = torch.ones(elems // g, device=device)
            recv = torch.empty(elems, device=device)
            # torch 2.13 renamed the tensor forms (*_single); older releases only have the old names
            gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
            scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
            ops = {
                "all_reduce": lambda: dist.all_reduce(full, group=mine),
                "all_gather": lambda: gather(recv, part, group=mine),
                "reduce_scatter": lambda: scatter(part, full, group=mine),
                "all_to_all": lambda: dist.all_to_all_single(recv, full, group=mine),
            }
            for kind, fn in ops.items():
                s = _time_collective(fn, device, p["min_time_s"], p["trials"])
                out.append({"collective": kind, "group": g, "bytes": elems * 4, "seconds": s})
            if g == 2:  # neighbour pairs exchange one message each way, as pipeline stages do
                peer = rank ^ 1
                send, got = torch.ones(elems, device=device), torch.empty(elems, device=device)

                def exchange():
                    reqs = [dist.isend(send, peer), dist.irecv(got, peer)]
                    for r in reqs:
                        r.wait()

                s = _time_collective(exchange, device, p["min_time_s"], p["trials"])
                out.append({"collective": "send_recv", "group": 2, "bytes": elems * 4, "seconds": s})
    return out


def _rss_bytes() -> int:
    """Current resident set size (Linux /proc; falls back to the peak)."""
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
        return pages * resource.getpagesize()
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _held_bytes(device) -> int:
    """What the process holds outside tensors: on an accelerator the device memory PyTorch's
    allocator did not reserve (context, communicators), on CPU the resident set."""
    from dayzero.runtime.device import memory_stats

    context = memory_stats(device).context
    return _rss_bytes() if context is None else int(context)


def memory_overhead(device) -> dict:
    """Bytes a rank holds before any tensor, and what each extra communicator adds."""
    import torch
    import torch.distributed as dist

    world = dist.get_world_size()
    try:  # a training rank has the runtime loaded before its first tensor: count its modules too
        import dayzero.runtime.train  # noqa: F401
    except ImportError:
        pass
    before = _held_bytes(device)
    n = 2
    for _ in range(n):
        grp = dist.new_group(list(range(world)))
        dist.all_reduce(torch.ones(1, device=device), group=grp)
    _sync(device)
    after = _held_bytes(device)
    return {"runtime_context_bytes": int(before), "comm_buffer_bytes": int(max(0, after - before) / n)}


def machine(device) -> dict:
    import os

    import torch
    import torch.distributed as dist

    info = {"hostname": platform.node(), "device": device.type, "torch": torch.__version__,
            "backend": dist.get_backend(), "ranks": dist.get_world_size(), "threads_per_rank": torch.get_num_threads(),
            "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()}
    if device.type != "cpu":
        from dayzero.runtime.device import alloc_conf, device_name, device_total_bytes

        info.update(name=device_name(device), memory_bytes=int(device_total_bytes(device) or 0))
        if alloc_conf(device.type):  # expandable segments and the like change what memory_overhead sees
            info["allocator"] = alloc_conf(device.type)
    else:
        try:
            with open("/proc/cpuinfo") as f:
                info["cpu"] = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")),
                                   info["cpu"])
            with open("/proc/meminfo") as f:
                info["memory_bytes"] = int(next(ln.split()[1] for ln in f if ln.startswith("MemTotal"))) * 1024
        except (OSError, StopIteration):
            info["memory_bytes"] = 0
    return info


def run_rank(args: dict) -> dict:
    """One rank's share of ``dayzero calibrate``: every table above (collective rows are the
    slowest rank's, the rest this rank's own)."""
    import torch

    from dayzero.runtime.distributed import init_distributed

    device = init_distributed()
    import torch.distributed as dist

    torch.manual_seed(dist.get_rank())
    p = plan(device.type, dist.get_world_size(), bool(args.get("quick")))
    p.update({k: v for k, v in args.get("plan", {}).items() if v is not None})
    out = {"machine": machine(device), "memory_overhead": memory_overhead(device), "plan": p}
    skip = set(args.get("skip", ()))
    if "gemm" not in skip:
        out["gemm"] = gemm(device, p)
    if "memory" not in skip:
        out["memory_bandwidth"] = triad(device, p)
    if "attention" not in skip:
        out["attention"] = attention(device, p)
    if "collectives" not in skip and dist.get_world_size() > 1:
        out["collectives"] = collectives(device, p)
    return out
