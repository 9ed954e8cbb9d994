"""The runtime: trains a ParallelConfig for real on PyTorch's distributed engine.

Read top to bottom: ``model`` (the zoo, built from a ModelSpec), ``mesh`` (one device mesh with
named dims), ``parallelize`` (pipeline split -> TP/SP + EP -> activation checkpointing -> FSDP2 ->
materialize), ``data`` (the token stream), ``optim`` (AdamW, warmup-cosine, global grad-norm
clipping), ``train`` (the step function and loop), ``launch`` (torchrun). Everything here imports
torch; nothing below this layer imports from it.
"""
