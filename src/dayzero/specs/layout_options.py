"""The layout a user states as flags: one object for every verb that takes a layout (``memory``,
``predict``, ``train``, ``validate``), turned into a :class:`ParallelConfig` in one place."""

from __future__ import annotations

from dataclasses import dataclass, fields

from dayzero.errors import LayoutError
from dayzero.specs.layout_fields import BY_NAME, layout_fields, option_fields, with_fields
from dayzero.specs.parallel import ParallelConfig


@dataclass(frozen=True)
@with_fields(option_fields())
class LayoutOptions:
    """Degrees, batch and the memory-shaping settings of one layout, as given: one field per layout
    flag, declared in :data:`dayzero.specs.layout_fields.FIELDS` (``dp`` None: the devices left
    over by tp x pp x cp; ``gbs`` None: mbs x dp; ``schedule`` None: interleaved when vpp > 1, else
    1F1B; ``recompute_modules`` and ``layer_split`` as the comma-separated text of their flags;
    ``recompute_modules`` implies selective recompute, ``recompute_layers`` full)."""

    def pinned(self, seq_default: int | None = None) -> list[str]:
        """The ``--flag`` of every field set away from its default (``seq`` and ``gbs`` are not
        layout choices a plan makes, so they are left out)."""
        out = []
        for f in fields(self):
            if f.name in ("seq", "gbs"):
                continue
            if getattr(self, f.name) != f.default:
                out.append(BY_NAME[f.name].flag.long)
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
        dp = self.data_parallel(devices)
        recompute, modules = self.modules()
        given = {f.name: getattr(self, f.name) for f in layout_fields() if getattr(self, f.name) is not None}
        return ParallelConfig(**{**given, "dp": dp, "gbs": self.default_gbs(dp, fill_pipeline), "recompute": recompute,
                                 "recompute_modules": modules, "layer_split": self.split(), "precision": precision,
                                 **({"rank_order": rank_order} if rank_order else {})})

    def resolve(self, devices: int | None, precision: str = "bf16", plan: str | None = None,
                rank_order: str | None = None, fill_pipeline: bool = False) -> ParallelConfig:
        """The layout from ``--plan`` (a ``dayzero plan --json`` file, every field it sets:
        plan_layout.layout_of; these flags must then be left at their defaults, but for ``--seq``
        and ``--gbs``) or else from the flags."""
        if not plan:
            return self.parallel(devices, precision, rank_order, fill_pipeline)
        from dayzero.specs.plan_layout import plan_layout

        given = self.pinned()
        if given:
            raise LayoutError(f"--plan sets the layout; drop {', '.join(given)}")
        par = plan_layout(plan, devices or 1, self.seq, self.gbs)  # every field of the plan, its precision too
        if precision != BY_NAME["precision"].flag.default and precision != par.precision:
            raise LayoutError(f"--plan sets the layout, its precision {par.precision} included; drop --precision")
        return par.with_(rank_order=rank_order) if rank_order else par
