"""Checkpoints: sharded, versioned, verified saves of a training run, and Hugging Face weights in and out.

Read in this order: ``manifest`` (what one version holds, its checksums and verification),
``versions`` (version directories on disk: naming, atomic commit, retention, picking one to
resume), ``lineage`` (which run wrote each version, in which order, on which branch), ``dirlock``
(one writing job per checkpoint directory), ``json_state`` (RNG and LR-scheduler state as JSON,
never pickled), ``state_dicts`` (model and optimizer state dicts named as the full model),
``dcp_io`` (the one wrapper around PyTorch Distributed Checkpoint internals), ``version_files``
(the names of a version's own files), ``side_files`` (those JSON files read back and checked
against the run before any value is used), ``rank_group`` (the checkpoint's own process group),
``async_saves`` (staging and the background write of an async save), ``commit`` (manifest,
verify, rename, retention), ``verification`` (one version's verdict, hashing split across ranks),
``loading`` (one version into a model at any layout), ``checkpointer`` (save, resume and load in
sequence: the :class:`Checkpointer`), ``hf_weights`` (Hugging Face safetensors ->
zoo parameter names), ``interchange`` (export a version as safetensors, import safetensors as a
version), ``inventory`` (list the versions of a directory and verify them: ``dayzero ckpt``).
"""
