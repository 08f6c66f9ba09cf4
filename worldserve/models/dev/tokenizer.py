"""Offline byte-level BPE tokenizer with a ChatML chat template (Qwen-style special tokens).

Trained in milliseconds on a fixed synthetic corpus, so it needs no download and is the same on
every machine. The byte-level alphabet means any string round-trips through encode/decode.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
VISION_START = "<|vision_start|>"
VISION_END = "<|vision_end|>"
IMAGE_PAD = "<|image_pad|>"
VIDEO_PAD = "<|video_pad|>"
# Order fixes their ids (0..6): keep it, or every dev checkpoint's embeddings shift.
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END, VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD)

# ChatML as Qwen2.5-VL renders it, minus the default system message (render what was sent).
# Content is a string or a list of parts: {"type": "text"}, {"type": "image"|"image_url"},
# {"type": "video"}; each image becomes one <|image_pad|> that the processor expands.
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}"
    "{% for c in m['content'] %}"
    "{% if c['type'] in ('image', 'image_url') %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif c['type'] == 'video' %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

_WORDS = (
    "a person walks a red car turns left the camera pans frame hazard clear yes no robot arm "
    "picks up the blue cup scene shows road street light traffic stop go forward right"
).split()


def synthetic_corpus(num_lines: int = 240) -> Iterator[str]:
    """Fixed training text: scene words, numbers and JSON fragments (what tests emit)."""
    for i in range(num_lines):
        words = " ".join(_WORDS[(i * 7 + j) % len(_WORDS)] for j in range(12))
        yield f'{words} {i} {{"k": {i}, "ok": true}}'


def build_tokenizer(vocab_size: int = 512, model_max_length: int = 4096,
                    corpus: Iterable[str] | None = None) -> PreTrainedTokenizerFast:
    """Train the byte-level BPE tokenizer and wrap it for transformers.

    `corpus` None: `synthetic_corpus()`. The dev world's checkpoint passes its own text (its
    grammar and the pipeline's templates), so that its words are single tokens.

    `model_max_length` is what pipelines pad or truncate to (the VLM's context for the reasoner,
    the text encoder's sequence length for diffusers slots). EOS is `<|im_end|>`, PAD is
    `<|endoftext|>`, there is no BOS, like Qwen's instruct tokenizers.
    """
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    core.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(corpus if corpus is not None else synthetic_corpus(),
                             trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token=None,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        additional_special_tokens=list(SPECIAL_TOKENS[1:]),
        chat_template=CHAT_TEMPLATE,
        model_max_length=model_max_length,
    )
