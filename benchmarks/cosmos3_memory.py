"""Memory of the two Cosmos3 arrangements: generator and reasoner each holding the
understanding (LLM) weights, vs one process where the reasoner's LLM parameters are the
generator's (`cosmos3_reasoner.sharing.tie_text_pathway`).

1. the tiny dev directory (generator transformer + reasoner), loaded for real: parameter bytes
   of each arrangement (shared storage counted once), and whether tied logits are unchanged;
2. a Nano-shaped model (the class defaults: hidden 4096, 36 layers; a Qwen3-VL ViT) built on
   the meta device: the same figures from shapes alone, in bf16.

    python benchmarks/cosmos3_memory.py

Prints one JSON line per part. Parameter bytes, not process RSS: on the tiny model RSS is all
library code, and the meta build allocates nothing. With a GPU, compare
`torch.cuda.memory_allocated()` after loading each arrangement.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import harness  # noqa: E402
from worldserve.models import registry  # noqa: E402
from worldserve.models.cosmos3_reasoner.dev import (  # noqa: E402
    write_generator_transformer,
    write_reasoner_files,
)
from worldserve.models.cosmos3_reasoner.sharing import unique_parameter_bytes  # noqa: E402
from worldserve.models.cosmos3_reasoner.text_pathway import shared_pairs  # noqa: E402

GIB = 1024**3


def part_dev(model_type: str) -> dict:
    from diffusers.models.transformers.transformer_cosmos3 import Cosmos3OmniTransformer

    with tempfile.TemporaryDirectory() as tmp:
        target = Path(tmp)
        write_generator_transformer(target, 0, model_type)
        write_reasoner_files(target, 0, model_type)
        generator = Cosmos3OmniTransformer.from_pretrained(target / "transformer").eval()
        alone = registry.load_runner("reasoner", target)
        tied = registry.load_runner("reasoner", target, generator=generator)
        ids = list(range(10, 40))
        same = torch.equal(alone.forward(alone.new_kv(), ids, num_logits=8),
                           tied.forward(tied.new_kv(), ids, num_logits=8))
        separate = unique_parameter_bytes(generator) + unique_parameter_bytes(alone.model)
        shared = unique_parameter_bytes(generator, tied.model)
    return {"part": "dev", "model_type": model_type, "two_copies_bytes": separate,
            "one_copy_bytes": shared, "saved_bytes": separate - shared,
            "saved_share": round((separate - shared) / separate, 3),
            "tied_logits_equal": same}


def nano_shaped() -> tuple[torch.nn.Module, torch.nn.Module]:
    """The generator transformer and the Omni reasoner at the class defaults, on meta."""
    from diffusers.models.transformers.transformer_cosmos3 import Cosmos3OmniTransformer
    from transformers import Cosmos3OmniConfig, Cosmos3OmniForConditionalGeneration

    with torch.device("meta"):
        generator = Cosmos3OmniTransformer(dtype="bfloat16")
        c = generator.config
        text = dict(vocab_size=c.vocab_size, hidden_size=c.hidden_size, head_dim=c.head_dim,
                    intermediate_size=c.intermediate_size,
                    num_hidden_layers=c.num_hidden_layers,
                    num_attention_heads=c.num_attention_heads,
                    num_key_value_heads=c.num_key_value_heads)
        config = Cosmos3OmniConfig(text_config=text,
                                   vision_config={"out_hidden_size": c.hidden_size})
        reasoner = Cosmos3OmniForConditionalGeneration(config)
    return generator, reasoner


def part_nano() -> dict:
    generator, reasoner = nano_shaped()
    bf16 = 2

    def count(module: torch.nn.Module) -> int:
        return sum(p.numel() for p in module.parameters())

    params = dict(reasoner.named_parameters())
    shared = sum(params[name].numel() for _, name in shared_pairs(generator, reasoner,
                                                                  "cosmos3_omni"))
    gen, rea = count(generator), count(reasoner)
    return {"part": "nano_shaped_bf16", "generator_params": gen, "reasoner_params": rea,
            "shared_params": shared,
            "two_copies_gib": round((gen + rea) * bf16 / GIB, 2),
            "one_copy_gib": round((gen + rea - shared) * bf16 / GIB, 2),
            "saved_gib": round(shared * bf16 / GIB, 2)}


def main() -> None:
    torch.set_num_threads(1)
    for model_type in ("cosmos3_omni", "cosmos3_edge"):
        harness.emit(part_dev(model_type))
    harness.emit(part_nano())


if __name__ == "__main__":
    main()
