"""Re-make the shipped dev-world weights: `python -m tools.world_training.retrain`.

Three runs, each from the dev build's seeded initial weights: the VAE (train_vae.py) and the
sound tokenizer (train_sound.py), each its own command (this one takes the files they wrote,
`--vae FILE --sound FILE`), then the generator and its reasoner together on the frozen VAE
(train_world.py), then the generator's sound stage on the frozen sound tokenizer, the reasoner
frozen (sound_stage.py). `trained.save` then writes
`worldserve/models/dev/world/weights/cosmos3_world.safetensors` and its manifest (configs, CPU
minutes, the accuracies measured on held-out seeds during training). Every random draw is
seeded, so a rerun on one torch version and thread count should give the same weights (not
checked by a second run); the figures in the manifest are what the shipped run measured.

    python -m tools.world_training.train_vae --out /tmp/world-vae.safetensors
    python -m tools.world_training.train_sound --out /tmp/world-sound.safetensors
    python -m tools.world_training.retrain --vae /tmp/world-vae.safetensors \
        --sound /tmp/world-sound.safetensors
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from tools.world_training import train_sound
from tools.world_training.sound_stage import SoundStageConfig, train_sound_stage
from tools.world_training.train_world import WorldTrainConfig, train_world
from worldserve.models.dev.world import trained


def read_vae(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as handle:
        metadata = handle.metadata() or {}
        return ({k: handle.get_tensor(k) for k in handle.keys()},
                {k: json.loads(v) for k, v in metadata.items()})


def retrain(vae_path: Path, sound_path: Path,
            world_cfg: WorldTrainConfig = WorldTrainConfig(),
            sound_cfg: SoundStageConfig = SoundStageConfig(), *,
            threads: int = 1, log: Any = print) -> dict[str, Any]:
    """Train the generator and reasoner on the VAE at `vae_path`, then the generator's sound
    on the sound tokenizer at `sound_path`; write the shipped weights; returns the manifest."""
    from worldserve.models.cosmos3.dev import build_pipeline, world_config
    from worldserve.models.cosmos3.runner import load_runner as load_generator
    from worldserve.models.cosmos3_reasoner.dev import write_reasoner_files
    from worldserve.models.cosmos3_reasoner.loader import load_runner as load_reasoner
    from worldserve.models.dev import DEV_MODELS_SEED

    torch.set_num_threads(threads)
    vae_state, vae_record = read_vae(vae_path)
    autoencoder, sound_record = train_sound.load(sound_path)
    cfg = world_config()
    with tempfile.TemporaryDirectory(prefix="world-retrain-") as scratch:
        work = Path(scratch) / "world"
        pipe = build_pipeline(DEV_MODELS_SEED, cfg)
        pipe.vae.load_state_dict(vae_state, strict=True)
        pipe.vae.register_to_config(latents_mean=vae_record["latents_mean"],
                                    latents_std=vae_record["latents_std"])
        pipe.sound_tokenizer.decoder.load_state_dict(autoencoder.decoder.state_dict())
        pipe.save_pretrained(work)
        write_reasoner_files(work, DEV_MODELS_SEED, tokenizer_corpus=cfg.tokenizer_corpus)
        generator = load_generator(work)
        reasoner = load_reasoner(work, generator=generator.pipe.transformer)
        start = time.process_time()
        world_log = train_world(generator, reasoner, world_cfg, log)
        world_cpu_min = round((time.process_time() - start) / 60, 1)
        sound_stage = train_sound_stage(generator, reasoner, autoencoder, sound_cfg, log)
        reasoner.model.save_pretrained(work / "trained-reasoner")
        # The reasoner file a dev build writes beside the trained generator (its LLM copied
        # from it): the tensors of the trained reasoner that differ from it are its own.
        generator.pipe.transformer.save_pretrained(work / "transformer")
        write_reasoner_files(work, DEV_MODELS_SEED, tokenizer_corpus=cfg.tokenizer_corpus)
        manifest = {
            "made_by": ["python -m tools.world_training.train_vae",
                        "python -m tools.world_training.train_sound",
                        "python -m tools.world_training.retrain"],
            "torch": torch.__version__, "machine": platform.machine(), "threads": threads,
            "vae": vae_record.get("training"),
            "world": {"config": asdict(world_cfg), "cpu_min": world_cpu_min,
                      "history": world_log["history"]},
            "sound_tokenizer": sound_record, "sound_stage": sound_stage,
        }
        trained.save(generator.pipe.transformer, generator.pipe.vae, generator.pipe.sound_tokenizer,
                     work / trained.REASONER_WEIGHTS,
                     work / "trained-reasoner" / trained.REASONER_WEIGHTS,
                     vae_record["latents_mean"], vae_record["latents_std"], manifest)
    return manifest


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vae", type=Path, required=True,
                        help="the VAE train_vae.py wrote (--out)")
    parser.add_argument("--sound", type=Path, required=True,
                        help="the sound tokenizer train_sound.py wrote (--out)")
    parser.add_argument("--steps", type=int, default=WorldTrainConfig.steps)
    parser.add_argument("--eval-every", type=int, default=WorldTrainConfig.eval_every)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    cfg = WorldTrainConfig(steps=args.steps, eval_every=args.eval_every)
    retrain(args.vae, args.sound, cfg, threads=args.threads,
            log=lambda entry: print(json.dumps(entry), flush=True))
    print(f"wrote {trained.WEIGHTS_PATH} and {trained.MANIFEST_PATH}")


if __name__ == "__main__":
    main()
