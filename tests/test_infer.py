"""A model nobody registered: `workbench check` infers its module map from the registered layouts,
says which, and runs the conformance checks on it; a model that follows no layout is refused (exit 2)
with what was not found."""

from __future__ import annotations

from pathlib import Path

import pytest

from workbench.cli import main
from workbench.models.architectures import ARCHITECTURES


def build_tiny_vipllava(out_dir: Path) -> None:
    """A tiny VipLlava (model type `vipllava`: LLaVA's modules, its connector fed five tower layers
    at once) from its own config class, with the tiny LLaVA's tokenizer and processor files."""
    from transformers import CLIPImageProcessorPil, VipLlavaConfig, VipLlavaForConditionalGeneration

    from workbench.models.architectures import tiny_llava
    from workbench.models.tinykit import _VOCAB_SIZE, _byte_level_tokenizer, _ids, _init_model, _save

    tokenizer = _byte_level_tokenizer(tiny_llava.LLAVA_SPECIAL_TOKENS, chat_template=tiny_llava.LLAVA_CHAT_TEMPLATE,
                                      add_bos="<s>", bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                      pad_token="<pad>", extra_special_tokens={"image_token": "<image>"})
    bos, eos, image, pad = _ids(tokenizer, "<s>", "</s>", "<image>", "<pad>")
    size, patch = tiny_llava.IMAGE, tiny_llava.PATCH
    config = VipLlavaConfig(
        text_config=dict(model_type="llama", vocab_size=_VOCAB_SIZE, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, bos_token_id=bos,
                         eos_token_id=eos, pad_token_id=pad, tie_word_embeddings=False),
        vision_config=dict(model_type="clip_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                           num_attention_heads=2, image_size=size, patch_size=patch, projection_dim=32),
        vision_feature_layers=[-2, -1, 0], image_token_index=image, image_seq_length=tiny_llava.NUM_PATCHES,
        pad_token_id=pad, tie_word_embeddings=False)
    model = _init_model(VipLlavaForConditionalGeneration, config, seed=0)
    image_processor = CLIPImageProcessorPil(size={"shortest_edge": size}, crop_size={"height": size, "width": size})
    _save(model, tokenizer, out_dir, image_processor, {"processor_config.json": {
        "processor_class": "LlavaProcessor", "patch_size": patch, "vision_feature_select_strategy": "default",
        "num_additional_image_tokens": 1}})


@pytest.fixture(scope="module")
def tiny_vipllava(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tiny-vipllava")
    build_tiny_vipllava(out)
    return out


def test_the_unregistered_type_is_not_a_family():
    assert "vipllava" not in {a.family for a in ARCHITECTURES}
    assert not any("VipLlavaForConditionalGeneration" in a.config_architectures for a in ARCHITECTURES)


def test_check_infers_the_layout_of_an_unregistered_vlm_and_passes(tiny_vipllava, capsys):
    assert main(["check", str(tiny_vipllava), "--device", "cpu", "--dtype", "float32"]) == 0
    out = capsys.readouterr().out
    assert ("INFO  module map inferred: model type 'vipllava' (VipLlavaForConditionalGeneration) is not registered; "
            "its modules follow the layout of family 'llava'") in out
    assert "PASS  residual stream = plain forward pre-hooks: max |difference| 0.00e+00" in out
    assert "PASS  vision tokens = image-token positions: 16 labelled vision" in out
    assert "PASS  alpha = 1 equals the baseline" in out
    assert "all checks passed" in out


def test_the_inferred_module_map_reads_the_models_own_modules(tiny_vipllava):
    """The inferred paths name the loaded model's modules, and its layer count is the config's."""
    import transformers

    from workbench.models.infer import declared_paths, inferred_info

    info, layout = inferred_info(str(tiny_vipllava))
    assert layout is not None and layout.matched.family == "llava"
    assert (info.arch.family, info.arch.model_class) == ("vipllava", "VipLlavaForConditionalGeneration")
    config = transformers.AutoConfig.from_pretrained(tiny_vipllava)
    assert (info.n_layers, info.hidden_size, info.n_vision_layers) == (2, 64, 3) == (
        config.text_config.num_hidden_layers, config.text_config.hidden_size, config.vision_config.num_hidden_layers)
    model = transformers.VipLlavaForConditionalGeneration.from_pretrained(tiny_vipllava)
    names = dict(model.named_modules())
    assert all(path in names for path in declared_paths(info.arch).values())
    assert "model.multi_modal_projector.projector_layernorm" in names  # VipLlava's own connector, read as LLaVA's


def test_an_unregistered_text_model_is_read_as_llama(tmp_path, capsys):
    """Qwen2 (model type `qwen2`, no family of its own) has Llama's module tree."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from workbench.models.architectures.tiny_llama import LLAMA_CHAT_TEMPLATE, LLAMA_SPECIAL_TOKENS
    from workbench.models.tinykit import _VOCAB_SIZE, _byte_level_tokenizer, _init_model, _save

    tokenizer = _byte_level_tokenizer(LLAMA_SPECIAL_TOKENS, chat_template=LLAMA_CHAT_TEMPLATE,
                                      add_bos="<|begin_of_text|>", bos_token="<|begin_of_text|>",
                                      eos_token="<|eot_id|>", pad_token="<|end_of_text|>")
    config = Qwen2Config(vocab_size=_VOCAB_SIZE, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                         num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=False)
    _save(_init_model(Qwen2ForCausalLM, config, seed=0), tokenizer, tmp_path)
    assert main(["check", str(tmp_path), "--device", "cpu", "--dtype", "float32"]) == 0
    out = capsys.readouterr().out
    assert ("model type 'qwen2' (Qwen2ForCausalLM) is not registered; its modules follow the layout of family "
            "'llama'") in out
    assert "PASS  residual stream = plain forward pre-hooks: max |difference| 0.00e+00 over 4 layers" in out


def test_a_model_that_follows_no_layout_is_refused_naming_what_is_missing(tmp_path, capsys):
    """GPT-2 (`transformer.h`, `transformer.wte`): no registered layout's paths resolve."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from workbench.models.architectures.tiny_llama import LLAMA_CHAT_TEMPLATE, LLAMA_SPECIAL_TOKENS
    from workbench.models.tinykit import _byte_level_tokenizer, _init_model, _save

    config = GPT2Config(vocab_size=320, n_embd=32, n_layer=2, n_head=2, n_positions=128)
    tokenizer = _byte_level_tokenizer(LLAMA_SPECIAL_TOKENS, chat_template=LLAMA_CHAT_TEMPLATE)
    _save(_init_model(GPT2LMHeadModel, config, seed=0), tokenizer, tmp_path)
    assert main(["check", str(tmp_path), "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "model type 'gpt2' (GPT2LMHeadModel) is not registered and its modules follow no known layout" in err
    assert "llama: no module model.embed_tokens, no module model.layers, no module model.norm" in err
