"""The memory room: per-device bytes of a training step for any parallel layout, for one layout
and for whole grids.

Reading order: ``memory_options`` (every bytes-per-element and overhead term, overridable),
``params`` (what one rank holds of each layer), ``activations`` (the tensors a layer saves for
backward, per recompute mode and module), ``activation_offload`` (saved activations sent to host
memory), ``offload`` (optimizer states in host memory), ``memory_terms`` (every named term, for
candidates x pipeline ranks), ``memory`` (the peak per stage: :func:`estimate_memory`,
:func:`peak_memory_batch`), ``balance`` (the layer split minimising the peak stage),
``allocator`` and ``replay`` (a caching block allocator replaying one step) and
``memory_breakdown`` (all of it for one layout, as ``dayzero memory`` reports it).
Pipeline in-flight counts come from :mod:`dayzero.planner.schedule`.
"""

from dayzero.planner.exports import lazy_exports

EXPORTS = {
    "MemoryOptions": "memory_options", "KERNEL_MEMORY": "memory_options", "MOMENT_BYTES": "memory_options",
    "check_attention_kernel": "memory_options",
    "layer_params": "params",
    "Dims": "activations", "LAYER_INPUT": "activations", "TRACED": "activations", "attention_terms": "activations",
    "layer_terms": "activations", "mlp_terms": "activations", "module_terms": "activations",
    "recompute_modules_sets": "activations",
    "COLUMN": "activation_offload", "check_activation_offload": "activation_offload",
    "fewest_offloaded_layers": "activation_offload", "layer_saved_bytes": "activation_offload",
    "offload_exposed_mb": "activation_offload", "offload_layers_of": "activation_offload",
    "host_bytes": "offload", "offloaded_optimizer_s": "offload",
    "RECOMPUTE_EXCESS": "memory_terms",
    "estimate_memory": "memory", "peak_memory_batch": "memory", "model_states": "memory",
    "zero_state_bytes": "memory", "optimizer_host_batch": "memory", "a2a_extra_batch": "memory",
    "plot_timeline": "replay",
    "memory_layout": "memory_breakdown",
}
__all__ = sorted(EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, EXPORTS)
