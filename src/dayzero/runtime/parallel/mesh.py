"""One device mesh per job, with named dims, built once from the ParallelConfig.

Rank order is Megatron's ``tp-cp-dp-pp`` (tp fastest), so a tensor-parallel group is a run of
neighbouring ranks (one node's fast links). Four views (five with cp > 1) share the same 1-D
world mesh:

    dense   (pp, dp_replicate, dp_shard, cp, tp)  attention, dense MLPs, embeddings, head
    expert  (pp, edp_replicate, edp_shard, ep)    routed experts: ep fastest, borrowing ranks
                                                  from tp x cp x dp of one stage
    moe_dp  (pp, mdp_replicate, mdp_shard)        router and shared experts: every rank of a
                                                  stage holds different tokens, so they are
                                                  plain data parallel over the whole stage
    stage   (pp, stage)                           reductions over all ranks of one stage
    dp_cp   (pp, dpcp_replicate, dpcp_shard, tp)  cp > 1 only: dense parameters' gradients, reduced
                                                  over dp x cp (Megatron's dp-cp group): each cp
                                                  rank's tokens are different
    cp_tp   (pp, dp, cp_tp)                       cp > 1 only: the ranks that hold one micro-batch
                                                  (Megatron's tp-cp group), for MoE routing statistics

ZeRO 1-3 shard over ``*_shard`` (``*_replicate`` is 1); ZeRO-0 replicates over ``*_replicate``
(``*_shard`` is 1), which FSDP2 runs as plain all-reduce data parallelism. ``dp_cp`` numbers the
dp x cp ranks of a stage dp-major, cp-minor: its groups are those of dense (dp_replicate,
dp_shard, cp) flattened.

Each view numbers the world's ranks row-major over its dims, slowest first (the last dim is the
fastest): rank r of a view (pp, ..., tp) sits at ``np.arange(world).reshape(sizes)`` == r, which
is what ``DeviceMesh`` unflattening a 1-D world mesh does. :func:`view_groups` computes a view's
groups that way without torch; tests hold them equal to the planner's
``dayzero.planner.perf.topology.group_ranks`` (dense order ``tp-cp-dp-pp``, experts ``etp-ep-edp-pp``
with etp 1) and to the real DeviceMesh.

Worked example, 8 ranks, tp2 pp2 dp2, ep2: stage 0 is ranks 0-3, stage 1 ranks 4-7; tp groups
{0,1} {2,3} {4,5} {6,7}; dp groups {0,2} {1,3} ...; ep groups equal the tp groups here and the
expert-data-parallel groups {0,2} {1,3} ... hold the same experts.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dayzero.specs.parallel import ParallelConfig


@dataclass(frozen=True)
class MeshShape:
    """Every degree of every view, computed without torch (used by tests and error messages)."""

    pp: int
    dp_replicate: int
    dp_shard: int
    cp: int
    tp: int
    edp_replicate: int
    edp_shard: int
    ep: int
    mdp_replicate: int
    mdp_shard: int
    dpcp_replicate: int = 1
    dpcp_shard: int = 1

    @classmethod
    def of(cls, parallel: ParallelConfig) -> "MeshShape":
        p = parallel
        stage = p.tp * p.cp * p.dp
        edp = stage // p.ep
        replicate = p.zero == 0
        return cls(pp=p.pp,
                   dp_replicate=p.dp if replicate else 1, dp_shard=1 if replicate else p.dp,
                   cp=p.cp, tp=p.tp,
                   edp_replicate=edp if replicate else 1, edp_shard=1 if replicate else edp, ep=p.ep,
                   mdp_replicate=stage if replicate else 1, mdp_shard=1 if replicate else stage,
                   dpcp_replicate=p.dp * p.cp if replicate else 1, dpcp_shard=1 if replicate else p.dp * p.cp)

    @property
    def stage(self) -> int:
        return self.dp_replicate * self.dp_shard * self.cp * self.tp

    @property
    def world(self) -> int:
        return self.pp * self.stage

    def views(self) -> dict[str, tuple[tuple[str, int], ...]]:
        """Every view's (dim name, size), slowest dim first: how :func:`build_meshes` unflattens
        the world mesh."""
        views = {
            "dense": (("pp", self.pp), ("dp_replicate", self.dp_replicate), ("dp_shard", self.dp_shard),
                      ("cp", self.cp), ("tp", self.tp)),
            "expert": (("pp", self.pp), ("edp_replicate", self.edp_replicate), ("edp_shard", self.edp_shard),
                       ("ep", self.ep)),
            "moe_dp": (("pp", self.pp), ("mdp_replicate", self.mdp_replicate), ("mdp_shard", self.mdp_shard)),
            "stage": (("pp", self.pp), ("stage", self.stage)),
        }
        if self.cp > 1:
            views["dp_cp"] = (("pp", self.pp), ("dpcp_replicate", self.dpcp_replicate),
                              ("dpcp_shard", self.dpcp_shard), ("tp", self.tp))
            views["cp_tp"] = (("pp", self.pp), ("dp", self.dp_replicate * self.dp_shard), ("cp_tp", self.cp * self.tp))
        return views


def view_groups(shape: MeshShape, view: str, dims: tuple[str, ...]) -> list[list[int]]:
    """The rank groups of ``dims`` of one view (several dims flatten into one group, earlier dim
    major, as ``DeviceMesh[dims]``): every rank in exactly one group."""
    names, sizes = zip(*shape.views()[view])
    ranks = np.arange(shape.world).reshape(sizes)  # the view's coordinates of every rank
    axes = [names.index(d) for d in dims]
    rest = [i for i in range(len(names)) if i not in axes]
    groups = np.transpose(ranks, rest + axes).reshape(-1, int(np.prod([sizes[i] for i in axes])))
    return groups.tolist()


@dataclass(frozen=True)
class Meshes:
    parallel: ParallelConfig
    shape: MeshShape
    device_type: str
    world: object  # DeviceMesh (1-D)
    dense: object
    expert: object
    moe_dp: object
    stage: object
    dp_cp: object = None  # with cp > 1 only
    cp_tp: object = None  # with cp > 1 only

    # -- views asked for by name ---------------------------------------------------------
    @property
    def tp(self):
        return self.dense["tp"]

    @property
    def dp(self):
        """The 2-D (replicate, shard) data-parallel mesh FSDP2 takes for dense parameters: over
        dp x cp with context parallelism (every rank of it holds different tokens)."""
        if self.dp_cp is not None:
            return self.dp_cp["dpcp_replicate", "dpcp_shard"]
        return self.dense["dp_replicate", "dp_shard"]

    @property
    def cp(self):
        return self.dense["cp"]

    @property
    def ep(self):
        return self.expert["ep"]

    @property
    def edp(self):
        return self.expert["edp_replicate", "edp_shard"]

    @property
    def mdp(self):
        return self.moe_dp["mdp_replicate", "mdp_shard"]

    @property
    def pp_group(self):
        return self.dense["pp"].get_group()

    @property
    def stage_group(self):
        return self.stage["stage"].get_group()

    @property
    def pp_rank(self) -> int:
        return self.dense["pp"].get_local_rank()

    @property
    def tp_rank(self) -> int:
        return self.tp.get_local_rank()

    @property
    def micro_batch_group(self):
        """The ranks that together hold one micro-batch's tokens: tp x cp (None: this rank alone)."""
        if self.cp_tp is not None:
            return self.cp_tp["cp_tp"].get_group()
        return self.tp.get_group() if self.shape.tp > 1 else None

    @property
    def cp_rank(self) -> int:
        """Which slice of each sequence this rank holds."""
        return self.cp.get_local_rank()

    @property
    def dp_rank(self) -> int:
        """Which slice of the global batch this rank reads (replicate-major, then shard)."""
        rep = self.dense["dp_replicate"].get_local_rank()
        return rep * self.shape.dp_shard + self.dense["dp_shard"].get_local_rank()


def build_meshes(parallel: ParallelConfig, device_type: str) -> Meshes:
    """All views over the current process group's ranks; every rank must call this."""
    from torch.distributed.device_mesh import init_device_mesh

    from dayzero.runtime.torch_compat import unflatten_mesh

    s = MeshShape.of(parallel)
    world = init_device_mesh(device_type, (s.world,), mesh_dim_names=("world",))
    views = {}
    for name, dims in s.views().items():
        names, sizes = zip(*dims)
        views[name] = unflatten_mesh(world, sizes, names)
    return Meshes(parallel, s, device_type, world, **views)
