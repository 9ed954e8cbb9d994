"""Activation checkpointing (Chen et al. 2016): ``full`` re-runs whole transformer blocks in
backward, ``selective`` only the attention core (softmax(q k^T) v, the activations that grow with
sequence length squared; Korthikanti et al. 2022).

Applied by replacing the module's ``forward`` on the instance with a checkpointed call of the
original, instead of wrapping the module: parameter names stay exactly those of the model, so a
checkpoint saved with one recompute mode loads under another.
"""

from __future__ import annotations

import functools

from torch import nn
from torch.utils.checkpoint import checkpoint

from dayzero.runtime.models.model import Transformer


def _checkpoint_forward(module: nn.Module) -> None:
    inner = module.forward

    @functools.wraps(inner)
    def forward(*args, **kwargs):
        return checkpoint(inner, *args, use_reentrant=False, **kwargs)

    module.forward = forward


def apply_activation_checkpointing(model: Transformer, mode: str, layers: int | None = None) -> int:
    """Checkpoint ``model``'s blocks (``full``; only the first ``layers`` of this stage when given)
    or attention cores (``selective``). Returns how many modules were wrapped."""
    if mode == "none":
        return 0
    blocks = list(model.layers.values())
    if mode == "full":
        chosen = blocks if layers is None else blocks[:layers]
        for b in chosen:
            _checkpoint_forward(b)
        return len(chosen)
    if mode == "selective":
        for b in blocks:
            _checkpoint_forward(b.attention.core)
        return len(blocks)
    raise ValueError(f"recompute mode {mode!r}")
