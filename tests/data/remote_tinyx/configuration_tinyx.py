"""A tiny custom architecture for dayzero's remote-code tests (not a real model)."""

from transformers import PretrainedConfig


class TinyXConfig(PretrainedConfig):
    model_type = "tinyx"

    def __init__(self, vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=3, **kwargs):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        super().__init__(**kwargs)
