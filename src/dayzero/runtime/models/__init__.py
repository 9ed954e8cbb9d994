"""The model zoo: one decoder-only transformer built from any ModelSpec, in plain PyTorch.

Read in this order: ``attention`` (RMSNorm, rotary positions, grouped-query and multi-head latent
attention), ``mlp`` (the dense feed-forward block and its activations), ``grouped_gemm`` (the
routed experts' GEMMs: one grouped kernel where the device has it, a loop elsewhere), ``moe`` (router,
grouped routed experts, shared experts, balance losses, capacity), ``model`` (the blocks and the ``Transformer``,
deterministic initial weights), ``recompute`` (activation checkpointing of whole blocks or of the
attention core), ``proxy_shape`` (the proxy config of a model nobody taught dayzero: the flags
applied with its layer kinds and the ratios its code checks kept) and ``hf_model`` (that proxy built
as transformers' own module, trained as it is). Nothing here knows about parallelism;
:mod:`dayzero.runtime.parallel` shards these modules in place.
"""
