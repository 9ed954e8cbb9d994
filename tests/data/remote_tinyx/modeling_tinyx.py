"""A tiny custom architecture for dayzero's remote-code tests: LayerNorm + GELU MLP blocks."""

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers.modeling_outputs import CausalLMOutput

from .configuration_tinyx import TinyXConfig


class TinyXBlock(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.norm = nn.LayerNorm(config.hidden_size)
        self.up = nn.Linear(config.hidden_size, config.intermediate_size)
        self.act = nn.GELU()
        self.down = nn.Linear(config.intermediate_size, config.hidden_size)

    def forward(self, x):
        return x + self.down(self.act(self.up(self.norm(x))))


class TinyXForCausalLM(PreTrainedModel):
    config_class = TinyXConfig
    base_model_prefix = "tinyx"

    def __init__(self, config):
        super().__init__(config)
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(TinyXBlock(config) for _ in range(config.num_hidden_layers))
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self):
        return self.embed

    def get_output_embeddings(self):
        return self.lm_head

    def forward(self, input_ids=None, labels=None, **kwargs):
        x = self.embed(input_ids)
        for layer in self.layers:
            x = layer(x)
        logits = self.lm_head(x)
        loss = None
        if labels is not None:
            flat = logits[:, :-1].reshape(-1, logits.size(-1)).float()
            loss = nn.functional.cross_entropy(flat, labels[:, 1:].reshape(-1))
        return CausalLMOutput(loss=loss, logits=logits)
