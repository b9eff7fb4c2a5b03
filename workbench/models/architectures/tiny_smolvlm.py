"""Client side of the SmolVLM family: its tiny offline model and its image-only processor
(transformers; never shipped to a server)."""

from __future__ import annotations

from pathlib import Path

from ..tinykit import (
    _VOCAB_SIZE,
    _byte_level_tokenizer,
    _ids,
    _init_model,
    _save,
    check_processor,
    image_processor_and_template,
)

# SmolVLM2's template (as in transformers' SmolVLMProcessor.DEFAULT_CHAT_TEMPLATE, without the video
# branch): "<|im_start|>User:<image>question<end_of_utterance>\nAssistant:". No space after "User:"
# when the turn starts with an image, as in the real one.
SMOLVLM_CHAT_TEMPLATE = (
    "<|im_start|>{% for message in messages %}{{message['role'] | capitalize}}"
    "{% if message['content'] is string %}{{': ' + message['content']}}"
    "{% else %}{% if message['content'][0]['type'] == 'image' %}{{':'}}{% else %}{{': '}}{% endif %}"
    "{% for line in message['content'] %}"
    "{% if line['type'] == 'text' %}{{line['text']}}"
    "{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}"
    "{% endfor %}{% endif %}<end_of_utterance>\n{% endfor %}"
    "{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)


SMOLVLM_SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<fake_token_around_image>",
    "<image>",
    "<end_of_utterance>",
    "<global-img>",
    *[f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)],
]

SMOLVLM_TILE = 32  # image_processor.max_image_size.longest_edge == vision image_size
SMOLVLM_PATCH = 8
SMOLVLM_SCALE = 2
# (32/8)^2 patches per tile, pixel-shuffled by 2x2 -> 4 <image> tokens per tile.
SMOLVLM_IMAGE_SEQ_LEN = (SMOLVLM_TILE // SMOLVLM_PATCH) ** 2 // SMOLVLM_SCALE**2


def build_tiny_smolvlm(out_dir: Path, seed: int) -> None:
    from transformers import SmolVLMConfig, SmolVLMForConditionalGeneration, SmolVLMImageProcessorPil

    out_dir = Path(out_dir)
    tokenizer = _byte_level_tokenizer(
        SMOLVLM_SPECIAL_TOKENS,
        chat_template=SMOLVLM_CHAT_TEMPLATE,
        # Roles as in SmolVLM2's tokenizer_config.
        bos_token="<|im_start|>",
        eos_token="<end_of_utterance>",
        pad_token="<|im_end|>",
        unk_token="<|endoftext|>",
    )
    bos, eos, pad, image = _ids(tokenizer, "<|im_start|>", "<end_of_utterance>", "<|im_end|>", "<image>")

    image_processor = SmolVLMImageProcessorPil(
        do_image_splitting=True,  # keep splitting on: tiles + global image with <row_i_col_j> tokens
        max_image_size={"longest_edge": SMOLVLM_TILE},
        # 3 tiles on the long side (the real one: 1536 = 4 x 384). A 96x64 image gives 2 rows x 3 cols.
        size={"longest_edge": 3 * SMOLVLM_TILE},
    )
    # pad_token_id: transformers 5.25 configuration_utils.py wraps every config's init to take extra
    # kwargs (`__init_subclass__`), which its dataclass_transform does not tell a type checker
    config = SmolVLMConfig(  # type: ignore[call-arg]
        text_config=dict(
            model_type="llama",
            vocab_size=_VOCAB_SIZE,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=8192,
            rms_norm_eps=1e-5,
            rope_parameters={"rope_type": "default", "rope_theta": 273768.0},
            bos_token_id=bos,
            eos_token_id=eos,
            pad_token_id=pad,
            tie_word_embeddings=False,
        ),
        vision_config=dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            image_size=SMOLVLM_TILE,  # must equal max_image_size.longest_edge
            patch_size=SMOLVLM_PATCH,
        ),
        scale_factor=SMOLVLM_SCALE,
        image_token_id=image,
        # otherwise a default of 128002, outside this vocab
        pad_token_id=pad,
        tie_word_embeddings=False,  # untied lm_head, like SmolVLM2
    )
    model = _init_model(SmolVLMForConditionalGeneration, config, seed)
    model.generation_config.bos_token_id = bos
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = pad
    # processor_config.json carries image_seq_len for the processor, like the real checkpoint.
    _save(
        model,
        tokenizer,
        out_dir,
        image_processor,
        {"processor_config.json": {"image_seq_len": SMOLVLM_IMAGE_SEQ_LEN, "processor_class": "SmolVLMProcessor"}},
    )



def _smolvlm_image_seq_len(model_dir: str, processor_dict: dict) -> int:
    """image_seq_len from processor_config.json, checked against the model config."""
    from transformers import AutoConfig

    try:
        cfg = AutoConfig.from_pretrained(model_dir)
        vision = cfg.vision_config
        expected = (vision.image_size // vision.patch_size) ** 2 // cfg.scale_factor**2
    except (OSError, AttributeError):
        expected = None
    saved = processor_dict.get("image_seq_len")
    if saved is not None and expected is not None and saved != expected:
        raise ValueError(f"{model_dir}: processor image_seq_len {saved} != {expected} from config.json")
    if saved is None and expected is None:
        raise ValueError(f"{model_dir}: no image_seq_len in processor_config.json and no vision config")
    return saved if saved is not None else expected




_CLASS = None


def _processor_class():
    global _CLASS
    if _CLASS is None:
        from transformers import SmolVLMProcessor
        from transformers.processing_utils import ProcessorMixin

        class ImageOnlySmolVLMProcessor(SmolVLMProcessor):
            """SmolVLMProcessor without the video processor (which needs torchvision)."""

            @classmethod
            def get_attributes(cls):
                return ["image_processor", "tokenizer"]

            def __init__(self, image_processor, tokenizer, image_seq_len: int = 169, chat_template=None, **kwargs):
                super().__init__(image_processor, tokenizer, None, image_seq_len=image_seq_len,
                                 chat_template=chat_template, **kwargs)

            def apply_chat_template(self, conversation, chat_template=None, *args, **kwargs):
                # SmolVLMProcessor.apply_chat_template reads self.video_processor.num_frames/fps even
                # for image-only conversations; the generic implementation does not.
                return ProcessorMixin.apply_chat_template(self, conversation, chat_template, *args, **kwargs)

        _CLASS = ImageOnlySmolVLMProcessor
    return _CLASS


def load_processor(model_dir):
    """AutoTokenizer + SmolVLMImageProcessorPil in a SmolVLMProcessor subclass without video."""
    from transformers import SmolVLMImageProcessorPil, SmolVLMProcessor

    tokenizer, image_processor, template, processor_dict = image_processor_and_template(
        model_dir, SmolVLMProcessor, SmolVLMImageProcessorPil)
    seq_len = _smolvlm_image_seq_len(str(model_dir), processor_dict)
    processor = _processor_class()(image_processor, tokenizer, image_seq_len=seq_len, chat_template=template)
    return check_processor(processor, SmolVLMProcessor)


build_tiny = build_tiny_smolvlm
