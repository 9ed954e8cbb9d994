"""The memory recipe's flags as one option group (:mod:`dayzero.cli.option_groups`), built from the
shared option types of :mod:`dayzero.cli.common` (``--moments`` ... ``--activation-offload``)."""

from __future__ import annotations

from dataclasses import dataclass

from dayzero.cli.common import (
    ActFp8Opt,
    ActivationOffloadOpt,
    Fp8ParamOpt,
    MoeProbsOpt,
    MomentsOpt,
    OptimizerOffloadOpt,
    memory_recipe,
)


@dataclass(frozen=True)
class RecipeOptions:
    """How the model states and saved activations are held: the moments' dtype, where the routing
    weights are applied, FP8 activation inputs and parameters, and what is offloaded to the host."""

    moments: MomentsOpt = "fp32"
    moe_probs: MoeProbsOpt = "combine"
    act_fp8: ActFp8Opt = False
    fp8_params: Fp8ParamOpt = False
    optimizer_offload: OptimizerOffloadOpt = False
    activation_offload: ActivationOffloadOpt = 0

    def memory_options(self) -> dict:
        """The MemoryOptions keywords of these flags (cli.common.memory_recipe; refused one line each)."""
        return memory_recipe(self.moments, self.act_fp8, self.fp8_params, self.optimizer_offload,
                             self.activation_offload, moe_probs=self.moe_probs)

    def switch_flags(self) -> list[str]:
        """The memory switches on, as flags a next step repeats."""
        flags = [f for f, on in (("--fp8-param-gather", self.fp8_params),
                                 ("--optimizer-offload", self.optimizer_offload)) if on]
        return flags + (["--activation-offload", str(self.activation_offload)] if self.activation_offload else [])
