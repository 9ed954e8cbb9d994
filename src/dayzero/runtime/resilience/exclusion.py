"""The exclusion list of a run and the layout a restart takes without the excluded ranks.

A rank that an alert flags as failing (a straggler, a hang, a device error) is written to
``exclusions.json`` in the run's checkpoint directory: its rank in the attempt that flagged it,
the device slot it ran on (the index of the local device: ``LOCAL_RANK`` mapped through
:data:`SLOTS_ENV`), its host, the alert, the step and the time. The file is merged across
restarts (an entry is one (host, slot)), so a slot flagged once stays out of every later attempt.

:func:`reshape` is the rule a launcher applies before relaunching: run on spare slots when enough
are healthy (the layout unchanged); otherwise keep tp, cp, pp and ep and reduce the data-parallel
degree to the largest one the healthy slots allow, keeping the global batch (each data-parallel
rank accumulates more micro-batches); refuse with one line when no degree fits. Pure: no torch.

:func:`restart_plan` says the same for a cluster scheduler: Slurm's ``--exclude`` node list
(https://slurm.schedmd.com/sbatch.html#OPT_exclude) and a Kubernetes node affinity that keeps the
pods off the excluded nodes (``kubernetes.io/hostname NotIn [...]``,
https://kubernetes.io/docs/concepts/scheduling-eviction/assign-pod-node/#node-affinity).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Iterable

from dayzero.specs import layout_rules
from dayzero.specs.exclusions import Exclusion, ExclusionError, excluded_hosts
from dayzero.specs.model import ModelSpec
from dayzero.specs.parallel import ParallelConfig

SLOTS_ENV = "DAYZERO_DEVICE_SLOTS"  # "0,1,3": local rank i runs on device slot 3 when i == 2


def parse_slots(text: str | None, nproc: int) -> tuple[int, ...]:
    """:data:`SLOTS_ENV`'s value (None or empty: slots ``0..nproc-1``)."""
    if not text:
        return tuple(range(nproc))
    return tuple(int(s) for s in text.split(","))


@dataclass(frozen=True)
class Reshape:
    parallel: ParallelConfig  # the layout of the restarted job
    slots: tuple[int, ...]  # the device slots its ranks run on, local rank order
    spares_used: tuple[int, ...]  # slots that were spares before this restart

    @property
    def world(self) -> int:
        return len(self.slots)

    def describe(self, before: ParallelConfig) -> str:
        if self.parallel == before:
            return f"{self.world} ranks on slots {_ids(self.slots)} (spare slot(s) {_ids(self.spares_used)} " \
                   f"taken), layout unchanged"
        p = self.parallel
        return (f"{self.world} ranks on slots {_ids(self.slots)}: data parallelism {before.dp} -> {p.dp}, global "
                f"batch {p.gbs} kept ({before.microbatches} -> {p.microbatches} micro-batches of {p.mbs} per "
                "data-parallel rank)")


def _ids(xs: Iterable[int]) -> str:
    return ",".join(str(x) for x in xs) or "none"


def reshape(parallel: ParallelConfig, active: tuple[int, ...], spares: tuple[int, ...], excluded: frozenset[int],
            spec: ModelSpec | None = None) -> Reshape:
    """The layout and slots of a restart without the ``excluded`` slots.

    ``active``: the slots the failed attempt ran on (``len(active) == parallel.world``);
    ``spares``: idle slots kept for this. Healthy spares replace excluded slots first (the
    layout is unchanged); otherwise dp drops to the largest degree that the healthy slots hold
    with tp x cp x pp ranks per replica, that divides the global batch into whole micro-batches
    (gbs / (mbs x dp)) and that passes every layout rule (ep still divides tp x cp x dp, ...)."""
    if len(active) != parallel.world:
        raise ExclusionError(f"{len(active)} active slots for a layout of world {parallel.world}")
    healthy_active = [s for s in active if s not in excluded]
    healthy_spares = [s for s in spares if s not in excluded]
    if len(healthy_active) == len(active):
        return Reshape(parallel, tuple(active), ())
    need = len(active) - len(healthy_active)
    if len(healthy_spares) >= need:
        taken = tuple(healthy_spares[:need])
        # the replacement takes the excluded slot's place, so every other rank keeps its slot
        it = iter(taken)
        slots = tuple(s if s not in excluded else next(it) for s in active)
        return Reshape(parallel, slots, taken)
    pool = healthy_active + healthy_spares
    per_replica = parallel.tp * parallel.cp * parallel.pp
    tried = []
    for dp in range(min(parallel.dp - 1, len(pool) // per_replica), 0, -1):
        cand = parallel.with_(dp=dp)
        why = [] if parallel.gbs % (parallel.mbs * dp) == 0 else [
            f"gbs {parallel.gbs} is not a multiple of mbs {parallel.mbs} x dp {dp}"]
        why = why or layout_rules.problems(cand, spec, dp * per_replica)
        if not why:
            return Reshape(cand, tuple(pool[:cand.world]), tuple(s for s in pool[:cand.world] if s in spares))
        tried.append(f"dp{dp}: {why[0]}")
    detail = f" ({'; '.join(tried)})" if tried else ""
    raise ExclusionError(
        f"cannot restart without slot(s) {_ids(sorted(excluded))}: {len(pool)} healthy slot(s) remain and a data-"
        f"parallel replica needs tp x cp x pp = {per_replica}; no smaller dp keeps the global batch "
        f"{parallel.gbs}{detail}; add spares (--spares), free the excluded devices, or change --gbs")


def restart_plan(entries: Iterable[Exclusion], reshaped: Reshape | None) -> dict:
    """What a cluster restart needs: the excluded hosts as Slurm's ``--exclude`` option and as a
    Kubernetes node affinity, the excluded (host, slot) pairs, and the new layout when known."""
    entries = tuple(entries)
    hosts = excluded_hosts(entries)
    plan: dict = {"excluded": [asdict(e) for e in entries], "hosts": hosts,
                  "slurm": {"exclude": ",".join(hosts)} if hosts else {},
                  "kubernetes": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                      "nodeSelectorTerms": [{"matchExpressions": [
                          {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": hosts}]}]}}}} if hosts
                  else {}}
    if reshaped is not None:
        plan["parallel"] = reshaped.parallel.to_dict()
        plan["slots"] = list(reshaped.slots)
    return plan
