"""The parallel system: one module per dimension, applied to a zoo model in a fixed order.

Read in this order: ``mesh`` (the ParallelConfig as one device mesh with named views), then one
``apply_*`` per dimension: ``pipeline`` (pp: the model cut into virtual stages and the schedule
that runs them), ``tensor_parallel`` (tp + sequence parallel as DTensor plans), ``all_to_all``
(the token exchange and its row order), ``expert_parallel`` (ep: routed experts sharded, tokens
moved with all-to-all), ``expert_placement`` (an expert placement with replicated experts in the
dispatcher), ``context_parallel`` (cp: sequence slices, heads exchanged by all-to-all around the
attention core), ``data_parallel`` (dp: FSDP2, ZeRO and mixed precision), and ``parallelize`` (the one
function that applies them all, with activation checkpointing from
:mod:`dayzero.runtime.models.recompute`, then materializes the weights). ``hf_plan`` does the same
for transformers' own module of a derived model: FSDP2 per decoder layer and a TP plan derived from
module names and shapes, with ``hf_stages`` (its pipeline stages cut at decoder-layer boundaries and
per-layer recompute), ``hf_experts`` (its routed experts, found by structure, split over ep with
tokens dispatched by all-to-all) and ``hf_context`` (cp: sequence slices, heads exchanged by
all-to-all around transformers' attention core); what it cannot apply is refused.
"""
