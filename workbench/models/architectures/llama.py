"""Llama: a text-only decoder (the LLMs NDIF hosts)."""

from .base import Architecture

LLAMA = Architecture(
    family="llama",
    model_class="LlamaForCausalLM",
    config_architectures=("LlamaForCausalLM",),
    embed="model.embed_tokens",
    decoder_layers="model.layers",
    final_norm="model.norm",
    lm_head="lm_head",
    text_config=None,
    hub_id="meta-llama/Llama-3.1-8B",
    tiny="tiny-llama",
    client="tiny_llama",
)

ARCHITECTURES = (LLAMA,)
