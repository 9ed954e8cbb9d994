"""Which keys of a config.json a reader did not use: no config is read silently.

Every verb that reads a model config reports the keys it did not use (``unused_config_keys`` in
``--json``), for the hand-written parsers (:mod:`dayzero.specs.hf_config`, which record every key they
read) and for descriptions derived from the model's own code (:mod:`dayzero.derive`, which records
every config attribute the modeling code reads while the model is built).

``IRRELEVANT_KEYS`` are keys that never change what a training run costs: token ids, bookkeeping
written by ``save_pretrained`` and inference-only switches. Nothing model-specific belongs here.
Keys starting with ``_`` are annotations (``_name_or_path``, the presets' ``_dayzero``), not
architecture.
"""

from __future__ import annotations

IRRELEVANT_KEYS = frozenset({
    # bookkeeping written by save_pretrained / the hub
    "architectures", "auto_map", "transformers_version", "model_type", "name_or_path", "tokenizer_class",
    # token ids: which row of the vocabulary, not how many
    "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id", "decoder_start_token_id",
    # the checkpoint's storage dtype (the plan's precision is --precision)
    "torch_dtype", "dtype",
    # weight initialisation and inference-only switches
    "initializer_range", "use_cache", "return_dict", "output_attentions", "output_hidden_states",
    "use_return_dict", "id2label", "label2id", "problem_type",
    "chunk_size_feed_forward",  # transformers' generic inference-time chunking of feed-forward blocks
})


def unused_keys(cfg: dict, read: set[str] | frozenset[str]) -> list[str]:
    """Top-level keys of ``cfg`` neither in ``read`` nor known irrelevant, sorted."""
    return sorted(k for k in cfg if k not in read and k not in IRRELEVANT_KEYS and not k.startswith("_"))
