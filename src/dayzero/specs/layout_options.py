"""The layout a user states as flags: one object for every verb that takes a layout (``memory``,
``predict``, ``train``, ``validate``), turned into a :class:`ParallelConfig` in one place."""

from __future__ import annotations

from dataclasses import dataclass, fields

from dayzero.errors import LayoutError
from dayzero.specs.parallel import ParallelConfig


@dataclass(frozen=True)
class LayoutOptions:
    """Degrees, batch and the memory-shaping settings of one layout, as given (``dp`` None: the
    devices left over by tp x pp x cp; ``gbs`` None: mbs x dp; ``schedule`` None: interleaved when
    vpp > 1, else 1F1B; ``layer_split`` as the comma-separated text of ``--layer-split``)."""

    tp: int = 1
    pp: int = 1
    dp: int | None = None
    cp: int = 1
    cp_comm: str = "p2p"  # --cp-comm: p2p (ring attention) | a2a (Ulysses; ParallelConfig.cp_comm)
    ep: int = 1
    etp: int = 1
    vpp: int = 1
    mbs: int = 1
    gbs: int | None = None
    seq: int = 4096
    zero: int = 1
    recompute: str = "none"
    recompute_modules: str | None = None  # comma-separated (--recompute-modules); implies selective
    recompute_layers: int | None = None  # with full recompute: the first N layers of each model chunk
    sequence_parallel: bool = False
    schedule: str | None = None
    layer_split: str | None = None

    def pinned(self, seq_default: int | None = None) -> list[str]:
        """The ``--flag`` of every field set away from its default (``seq`` and ``gbs`` are not
        layout choices a plan makes, so they are left out)."""
        out = []
        for f in fields(self):
            if f.name in ("seq", "gbs"):
                continue
            if getattr(self, f.name) != f.default:
                out.append("--" + f.name.replace("_", "-"))
        return out

    def modules(self) -> tuple[str, tuple[str, ...]]:
        """(recompute mode, module set) of ``--recompute``, ``--recompute-modules`` and
        ``--recompute-layers``: modules imply selective recompute and a layer count full recompute
        when ``--recompute`` is not given; unknown names are a one-line
        LayoutError naming the valid ones."""
        from dayzero.specs.parallel import RECOMPUTE_MODULES

        if not self.recompute_modules:
            # a layer count implies full recompute when --recompute is not given
            implied = "full" if self.recompute_layers is not None and self.recompute == "none" else self.recompute
            return implied, ()
        names = tuple(m.strip() for m in self.recompute_modules.replace("+", ",").split(",") if m.strip())
        bad = [m for m in names if m not in RECOMPUTE_MODULES]
        if bad:
            raise LayoutError(f"--recompute-modules {self.recompute_modules!r}: {', '.join(bad)} not among "
                              f"{', '.join(RECOMPUTE_MODULES)}")
        return ("selective" if self.recompute == "none" else self.recompute), names

    def split(self) -> tuple[int, ...] | None:
        if not self.layer_split:
            return None
        try:
            return tuple(int(x) for x in self.layer_split.split(","))
        except ValueError:
            raise LayoutError(f"--layer-split {self.layer_split!r}: expected comma-separated integers, "
                              "e.g. 5,6,6,5") from None

    def data_parallel(self, devices: int | None) -> int:
        """``dp`` as given, else the devices tp x pp x cp leave (1 without a device count)."""
        if self.dp is not None:
            return self.dp
        if devices is None:
            return 1
        denom = self.tp * self.pp * self.cp
        if denom < 1 or devices % denom:
            raise LayoutError(f"{devices} devices are not divisible by tp*pp*cp = {self.tp}*{self.pp}*{self.cp} = "
                              f"{denom}; choose degrees whose product divides the device count, or give --dp")
        return devices // denom

    def default_gbs(self, dp: int, fill_pipeline: bool = False) -> int:
        """The global batch when ``--gbs`` is not given: one micro-batch per data-parallel rank
        (mbs x dp), or, to run a pipeline (``fill_pipeline``), pp micro-batches, the fewest a
        pipeline schedule accepts (each of the pp stages holds one in flight)."""
        if self.gbs:
            return self.gbs
        return self.mbs * dp * (self.pp if fill_pipeline and self.pp > 1 else 1)

    def gbs_note(self, parallel: ParallelConfig) -> str | None:
        """What was chosen for a global batch nobody gave, when it is more than mbs x dp."""
        if self.gbs or parallel.gbs == parallel.mbs * parallel.dp:
            return None
        return (f"--gbs not given: {parallel.gbs} (mbs {parallel.mbs} x dp {parallel.dp} x {parallel.microbatches} "
                f"micro-batches, the fewest a pipeline of pp {parallel.pp} runs)")

    def parallel(self, devices: int | None, precision: str = "bf16", rank_order: str | None = None,
                 fill_pipeline: bool = False) -> ParallelConfig:
        """The ParallelConfig on ``devices`` (checked where it is used: ``layout_rules.validate``);
        ``fill_pipeline``: a default global batch holds pp micro-batches (what a runtime needs)."""
        extra: dict = {"schedule": self.schedule} if self.schedule else {}
        if rank_order:
            extra["rank_order"] = rank_order
        dp = self.data_parallel(devices)
        recompute, modules = self.modules()
        return ParallelConfig(tp=self.tp, pp=self.pp, dp=dp, cp=self.cp, cp_comm=self.cp_comm, ep=self.ep,
                              etp=self.etp, vpp=self.vpp,
                              mbs=self.mbs, gbs=self.default_gbs(dp, fill_pipeline), seq=self.seq,
                              zero=self.zero, recompute=recompute, recompute_modules=modules,
                              recompute_layers=self.recompute_layers,
                              sequence_parallel=self.sequence_parallel,
                              precision=precision, layer_split=self.split(), **extra)

    def resolve(self, devices: int | None, precision: str = "bf16", plan: str | None = None,
                rank_order: str | None = None, fill_pipeline: bool = False) -> ParallelConfig:
        """The layout from ``--plan`` (a ``dayzero plan --json`` file; these flags must then be left
        at their defaults, but for ``--seq`` and ``--gbs``) or else from the flags."""
        if not plan:
            return self.parallel(devices, precision, rank_order, fill_pipeline)
        from dayzero.specs.plan_layout import plan_layout

        given = self.pinned()
        if given:
            raise LayoutError(f"--plan sets the layout; drop {', '.join(given)}")
        par = plan_layout(plan, devices or 1, self.seq, self.gbs).with_(precision=precision)
        return par.with_(rank_order=rank_order) if rank_order else par
