"""Checkpoints: sharded, versioned, verified saves of a training run, and Hugging Face weights in and out.

Read in this order: ``manifest`` (what one version holds, its checksums and verification),
``versions`` (version directories on disk: naming, atomic commit, retention, picking one to
resume), ``lineage`` (which run wrote each version, in which order, on which branch), ``dirlock``
(one writing job per checkpoint directory), ``json_state`` (RNG and LR-scheduler state as JSON,
never pickled), ``state_dicts`` (model and optimizer state dicts named as the full model),
``dcp_io`` (the one wrapper around PyTorch Distributed Checkpoint internals), ``checkpointer``
(save, resume and load: the :class:`Checkpointer`), ``hf_weights`` (Hugging Face safetensors ->
zoo parameter names), ``interchange`` (export a version as safetensors, import safetensors as a
version), ``inventory`` (list the versions of a directory and verify them: ``dayzero ckpt``).
"""
