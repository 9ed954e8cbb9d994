"""Pre-flight of a training run: every check the run makes before it starts ranks, in one function.

``dayzero train`` calls :func:`preflight_train` on the way to spawning ranks; ``dayzero train
--dry-run`` calls the same function with ``dry=True`` and stops there, printing what would run.
A config the check accepts therefore passes every check the real run makes before its ranks
start, and every refusal of the real run before that point is made by the check too.

What is checked: the layout against the runtime (:mod:`dayzero.runtime.checks`), the MoE and
placement options, the memory need against this machine (:mod:`dayzero.runtime.memory_check`),
the data, the checkpoint, fault drill and loss guard options
(:func:`dayzero.runtime.resilience.loop.resilience_config`), the alert options, the metrics port,
and the checkpoint directory: that it can be written, that no other job holds it, and which
version ``--resume`` picks (:func:`checkpoint_plan`; manifests and file sizes, and whether the
version was saved for this model; the checksums are verified when the ranks start).

``dry`` changes only what is touched, never what is accepted: a dry pre-flight writes nothing
(no directory is created, no lock taken; the write probe is a permission check), a real one
creates the checkpoint directory as the run would.

Torch-free.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path

from dayzero.errors import ConfigError
from dayzero.runtime.checkpoint.manifest import CheckpointError
from dayzero.runtime.config import TrainConfig
from dayzero.runtime.memory_check import HEADROOM, MemoryNeed
from dayzero.specs.model import ModelSpec
from dayzero.specs.parallel import ParallelConfig


@dataclass(frozen=True)
class ResumePlan:
    """Where ``--resume`` starts: a version (its step and path), or fresh."""

    mode: str  # auto | never | step | directory
    step: int | None = None  # None: from the start
    path: str | None = None
    skipped: tuple[str, ...] = ()  # versions auto would pass over, with the reason


@dataclass(frozen=True)
class CheckpointPlan:
    dir: str
    exists: bool
    complete_versions: int
    every: int
    keep: int
    async_save: bool
    resume: ResumePlan


@dataclass(frozen=True)
class TrainPreflight:
    """What a run would do: the model, layout, ranks, memory and checkpoint plan."""

    spec: ModelSpec
    parallel: ParallelConfig
    world: int
    steps: int
    compute_dtype: str
    memory: MemoryNeed | None  # None: not checked (--skip-memory-check, or ranks already up under torchrun)
    checkpoint: CheckpointPlan | None
    reset_attention_mask: bool = False  # packed documents, attention within each

    def to_dict(self, notes: list[str] | tuple[str, ...] = ()) -> dict:
        from dayzero.specs.counting import params_total

        s, p = self.spec, self.parallel
        mem = None
        if self.memory is not None:
            m = self.memory
            mem = {"per_rank_bytes": m.per_rank_bytes, "ranks_sharing": m.ranks_sharing, "need_bytes": m.need_bytes,
                   "available_bytes": m.available_bytes, "usable_bytes": int(HEADROOM * m.available_bytes),
                   "where": m.where, "fits": m.fits}
        return {"ok": True,
                "model": {"name": s.name, "params": params_total(s), "layers": s.layers, "hidden": s.hidden,
                          "vocab": s.vocab, "experts": s.moe.experts if s.moe else None},
                "ranks": self.world, "layout": p.describe(), "parallel": p.to_dict(), "steps": self.steps,
                "tokens_per_step": p.gbs * p.seq, "compute_dtype": self.compute_dtype, "memory": mem,
                "checkpoint": asdict(self.checkpoint) if self.checkpoint else None,
                "reset_attention_mask": self.reset_attention_mask, "notes": list(notes)}

    def lines(self, notes: list[str] | tuple[str, ...] = ()) -> list[str]:
        """The pre-flight for a person: what would run, then ``dry run passed``."""
        from dayzero.specs.counting import params_total

        s, p, GiB = self.spec, self.parallel, 2**30
        out = [f"{s.name} ({params_total(s) / 1e6:,.1f} M parameters, {s.layers} layers, hidden {s.hidden}): "
               f"{p.describe()} on {self.world} rank(s), {self.steps} step(s) in {self.compute_dtype}; "
               f"{p.gbs * p.seq:,} tokens per step ({p.gbs} x {p.seq}), {p.microbatches} micro-batch(es) of {p.mbs}"]
        if self.reset_attention_mask:
            out.append("packed documents: each token attends within its document (--reset-attention-mask)")
        if self.memory is None:
            out.append("memory: not checked")
        else:
            m = self.memory
            out.append(f"memory: {m.per_rank_bytes / GiB:,.2f} GiB per rank x {m.ranks_sharing} = "
                       f"{m.need_bytes / GiB:,.2f} GiB of {m.available_bytes / GiB:,.2f} GiB available on the "
                       f"{m.where} ({HEADROOM:.0%} usable)")
        c = self.checkpoint
        if c is None:
            out.append("checkpoints: none (no --ckpt-dir)")
        else:
            r = c.resume
            start = (f"resume step {r.step} ({r.path})" if r.step is not None
                     else "start fresh" + (" (--resume never)" if r.mode == "never" else ""))
            out.append(f"checkpoints: {c.dir} ({'exists' if c.exists else 'created at start'}, "
                       f"{c.complete_versions} complete version(s)); {start}; save "
                       f"{f'every {c.every} steps' if c.every else 'at the end'}, keep {c.keep}"
                       f"{', async' if c.async_save else ''}")
            out += [f"  would skip {s}" for s in r.skipped]
        out += [f"note: {n}" for n in notes]
        out.append("dry run passed: nothing was started or written (drop --dry-run to run)")
        return out


def preflight_train(cfg: TrainConfig, world: int, *, cpu: bool, torchrun: bool = False,
                    skip_memory_check: bool = False, dry: bool = False) -> TrainPreflight:
    """Every check ``dayzero train`` makes before starting ranks (raises DayzeroError: one line,
    exit 2); what the run would do otherwise. ``dry``: touch nothing (``--dry-run``)."""
    from dayzero.runtime.checks import check_runtime, document_problems
    from dayzero.runtime.data import resolve_data
    from dayzero.runtime.resilience.actions import check_alert_options
    from dayzero.runtime.resilience.loop import resilience_config

    parallel = cfg.parallel
    spec = cfg.spec()
    if spec.extra.get("derived") and parallel.cp > 1:  # the module that rules cp out, before the spec's rules
        from dayzero.runtime.parallel.hf_plan import check_derived_cp

        check_derived_cp(cfg)
    check_runtime(spec, parallel, world)
    if cfg.reset_attention_mask and (problems := document_problems(spec, parallel)):
        from dayzero.errors import LayoutError

        raise LayoutError("; ".join(problems))
    if spec.extra.get("derived"):  # transformers' own module: the dimensions it cannot apply, refused here
        from dayzero.errors import LayoutError
        from dayzero.runtime.parallel.hf_plan import derived_problems

        if problems := derived_problems(cfg):
            raise LayoutError("; ".join(problems))
    cfg.moe.check()
    if cfg.moe.placement is not None:
        from dayzero.specs.placement import load_placement

        if not spec.is_moe:
            raise ConfigError(cfg.moe.placement, None,
                              f"--placement places routed experts; {spec.name} has no MoE layers")
        load_placement(cfg.moe.placement, spec.moe.experts, parallel.ep)
    if cfg.model.hf_weights is not None and not Path(cfg.model.hf_weights).is_dir():
        raise ConfigError("--hf-weights", None, f"{cfg.model.hf_weights}: not a directory (a Hugging Face "
                                                "safetensors checkpoint directory)")
    need = None
    if not torchrun and not skip_memory_check:  # under torchrun the ranks are already up, allocating
        from dayzero.runtime.memory_check import check_memory

        need = check_memory(spec, parallel, world, cfg.compute_dtype, "cpu" if cpu else None)
    resolve_data(cfg.data)
    resilience_config(cfg)  # checkpoint, drill and guard options
    check_alert_options(cfg, torchrun, world)
    if cfg.monitor.port is not None:
        from dayzero.monitor.ports import check_ports

        local = int(os.environ.get("LOCAL_RANK", "0")) if torchrun else None
        check_ports(cfg.monitor.port, 1 if cfg.monitor.aggregate else world, local, cfg.monitor.aggregate)
    # under the user's torchrun rank 0 alone looks at the directory: a later rank could see this job's own lock
    # and versions being written
    plan = checkpoint_plan(cfg, spec, dry=dry) if not torchrun or os.environ.get("RANK") == "0" else None
    return TrainPreflight(spec, parallel, world, cfg.steps, cfg.compute_dtype, need, plan, cfg.reset_attention_mask)


def checkpoint_plan(cfg: TrainConfig, spec: ModelSpec, *, dry: bool) -> CheckpointPlan | None:
    """The checkpoint directory's part of the pre-flight: writable (a file or an unwritable
    directory refused), free (no other job holds its lock: looked up, not taken; a real run takes
    it next), and the version ``--resume`` picks. Read-only when ``dry``."""
    from dayzero.outputs import prepare_output
    from dayzero.runtime.checkpoint.versions import scan

    ck = cfg.checkpoint
    if not ck.dir:
        return None
    root = Path(ck.dir)
    existed = root.is_dir()
    from dayzero.runtime.checkpoint.dirlock import check_free_readonly

    prepare_output(root, "--ckpt-dir", "dir", dry=dry)
    check_free_readonly(root)  # before the versions: another job's lock is the first thing to say
    versions = scan(root) if existed else []
    complete = sum(v.state == "complete" for v in versions)
    resume = _resume_plan(root, versions, ck.resume, spec.digest())
    return CheckpointPlan(dir=str(root), exists=existed, complete_versions=complete, every=ck.every, keep=ck.keep,
                          async_save=ck.async_save, resume=resume)


def _resume_plan(root: Path, versions: list, which: str, digest: str) -> ResumePlan:
    """The version ``--resume`` picks (:meth:`Checkpointer.resume`'s choice, by marker, manifest,
    file sizes and model digest): a refusal the ranks would make is made here."""
    from dayzero.runtime.checkpoint.lineage import write_order
    from dayzero.runtime.checkpoint.manifest import verify_version
    from dayzero.runtime.checkpoint.versions import Version, select_newest, version_name

    def verdict(v: Version):
        """(integrity by manifest and sizes, why it does not fit this run)."""
        got = verify_version(v.path, checksums=False)
        have = got.manifest.model.spec_digest if got.manifest is not None else ""
        unfit = [f"saved for model {got.manifest.model.name or '?'} (spec {have}), this run builds spec {digest}"] \
            if got.ok and have and digest and have != digest else []
        return got, unfit

    def usable(v: Version):
        from dataclasses import replace

        got, unfit = verdict(v)
        return replace(got, problems=tuple(unfit)) if unfit else got

    if which == "never":
        return ResumePlan("never")
    if which == "auto":
        chosen, skipped = select_newest(versions, usable)
        notes = tuple(f"{s.path.name}: {s.problems[0]}" for s in skipped)
        if chosen is None:
            if any(v.state == "complete" for v in versions):
                raise CheckpointError(f"no checkpoint under {root} passes verification and fits this run (skipped: "
                                      + "; ".join(notes) + "); restore them from backup, or start over with a new "
                                      "--ckpt-dir")
            return ResumePlan("auto", skipped=notes)
        return ResumePlan("auto", chosen.manifest.step, str(chosen.path), notes)
    if str(which).isdigit():
        step = int(which)
        same = sorted((v for v in versions if v.step == step and v.state == "complete"), key=write_order)
        version = same[-1] if same else Version(root / version_name(step), step, "complete")
        mode = "step"
    else:
        path = Path(which)
        version = next((v for v in versions if v.path.resolve() == path.resolve()), Version(path, -1, "complete"))
        mode = "directory"
    got, unfit = verdict(version)
    if not got.ok:
        raise CheckpointError(f"checkpoint {version.path} failed verification: {got.summary()}")
    if unfit:
        raise CheckpointError(f"checkpoint {version.path} does not fit this run: {'; '.join(unfit)}; use the same "
                              "model or a new --ckpt-dir")
    return ResumePlan(mode, got.manifest.step, str(version.path))

