"""A tiny random Wan 2.1 T2V pipeline (+ action head) for generation tests (cpu-stack notes §8).

Used until the shared dev checkpoint covers everything these tests need; the layout is the one
`WanPipeline.save_pretrained` writes, so the engine loads it like a real checkpoint.
"""

from __future__ import annotations

import json
from pathlib import Path

SEED = 0


def _tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    core.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=384, special_tokens=special,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    words = "a red car turns left the camera pans over a wooden table cube robot arm".split()
    core.train_from_iterator([" ".join(words[i:] + words[:i]) for i in range(len(words))],
                             trainer=trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=core, bos_token=None, eos_token="<|im_end|>",
                                  pad_token="<|endoftext|>")
    tok.model_max_length = 64
    return tok


def build_tiny_wan(target: Path, *, action_head: bool = True) -> Path:
    import diffusers as D
    import torch
    import transformers as T

    torch.manual_seed(SEED)
    tok = _tokenizer()
    text_encoder = T.UMT5EncoderModel(T.UMT5Config(
        vocab_size=len(tok), d_model=32, d_kv=8, d_ff=37, num_layers=2, num_heads=4,
        relative_attention_num_buckets=8, pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id, decoder_start_token_id=tok.pad_token_id)).eval()
    vae = D.AutoencoderKLWan(base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                             temperal_downsample=[False, True, True])
    transformer = D.WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=16,
        out_channels=16, text_dim=32, freq_dim=256, ffn_dim=32, num_layers=2,
        cross_attn_norm=True, qk_norm="rms_norm_across_heads", rope_max_seq_len=32)
    pipe = D.WanPipeline(tokenizer=tok, text_encoder=text_encoder, vae=vae,
                         scheduler=D.FlowMatchEulerDiscreteScheduler(shift=7.0),
                         transformer=transformer)
    pipe.save_pretrained(target)
    (target / "worldserve_dev.json").write_text(json.dumps(
        {"name": "generation", "served_model_name": "tiny-wan-test"}))
    if action_head:
        from worldserve.models.action_head.dev import build_action_head

        build_action_head(target / "action_head", SEED)
    return target
