"""Train the dev Cosmos3 sound tokenizer on the dev world's sound tracks.

The dev sound tokenizer (`Cosmos3AVAEAudioTokenizer`, `build_sound_tokenizer`'s sizes: latent 8,
hop 16 at 400 Hz, a decoder of 4-8 channels) is decoder-only and random, so whatever latents a
generator makes, the waveform carries no tone. This trains the same class with the same decoder
sizes plus a small spectrogram encoder (its sizes are free: only the decoder ships, the
generator's sound stage uses the encoder to make its targets) as a VAE on world clips' sound
tracks: squared error of the waveform, absolute error of its spectrogram (the tone is a
frequency, which a waveform error alone learns slowly), and a small KL term with posterior
sampling so the latents stay near the unit scale the sampler's noise starts from.
Reconstructions of held-out clips (seeds < TRAIN_SEED_BASE) are scored by the evaluator's tone
reader (`evaluate.dominant_tone`).

    python -m tools.world_training.train_sound --out /tmp/world-sound.safetensors
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

from tools.world_training.train_vae import TRAIN_SEED_BASE
from worldserve.models.dev.world.evaluate import dominant_tone
from worldserve.models.dev.world.scenes import WorldConfig, make_clip

WORLD = WorldConfig()
HOP = 16  # the dev tokenizer's hop (dec_strides 4 x 4): the pipeline's sound latents round up
KINDS = ("motion", "stream", "agent")  # one colour; colour changes; clicks at edges


@dataclass(frozen=True)
class SoundTrainConfig:
    steps: int = 1500
    batch_size: int = 16
    learning_rate: float = 3e-3
    spectral_weight: float = 0.1
    kl_weight: float = 1e-4
    pool_clips: int = 600  # training tracks, a third of each kind
    num_eval: int = 100  # held-out motion clips (one tone each)
    eval_every: int = 250
    seed: int = 0


def build_autoencoder(seed: int) -> Any:
    """The dev tokenizer's class and decoder sizes (`build_sound_tokenizer`), with an encoder:
    a 32-point STFT at hop 4 (12.5 Hz bins; the tones are 30 Hz apart), then two stride-2 stages,
    so one latent per 16 samples like the decoder's hop."""
    from diffusers import Cosmos3AVAEAudioTokenizer

    from worldserve.models.cosmos3.dev import world_config

    cfg = world_config()
    torch.manual_seed(seed)
    return Cosmos3AVAEAudioTokenizer(
        sampling_rate=cfg.sound_sampling_rate, vocoder_input_dim=cfg.sound_dim, dec_dim=4,
        dec_c_mults=(1, 2), dec_strides=(4, 4), encoder_enabled=True, normalize_volume=False,
        enc_dim=16, enc_num_blocks=1, enc_n_fft=32, enc_hop_length=4, enc_c_mults=(1, 2),
        enc_strides=(2, 2), enc_latent_dim=2 * cfg.sound_dim)


def padded_track(sound: np.ndarray) -> torch.Tensor:
    """(2, N) -> (2, N rounded up to whole hops), zero-padded like the pipeline's latents."""
    length = -(-sound.shape[-1] // HOP) * HOP
    return torch.from_numpy(np.pad(sound, ((0, 0), (0, length - sound.shape[-1]))))


def encode(autoencoder: Any, tracks: torch.Tensor, sample: bool) -> torch.Tensor:
    """(B, 2, N) -> (B, latent, N / HOP)."""
    posterior = autoencoder.encode(tracks).latent_dist
    return posterior.sample() if sample else posterior.mode()


def spectrum(tracks: torch.Tensor) -> torch.Tensor:
    window = torch.hann_window(64)
    return torch.stft(tracks.reshape(-1, tracks.shape[-1]), n_fft=64, hop_length=16,
                      window=window, return_complex=True).abs()


def sound_loss(autoencoder: Any, tracks: torch.Tensor, cfg: SoundTrainConfig) -> torch.Tensor:
    posterior = autoencoder.encode(tracks).latent_dist
    decoded = autoencoder.decode(posterior.sample())
    spectral = (spectrum(decoded) - spectrum(tracks)).abs().mean()
    return (((decoded - tracks) ** 2).mean() + cfg.spectral_weight * spectral
            + cfg.kl_weight * posterior.kl().mean())


def build_pool(cfg: SoundTrainConfig) -> torch.Tensor:
    """(pool, 2, N) training tracks from seeds >= TRAIN_SEED_BASE."""
    tracks = [padded_track(make_clip(TRAIN_SEED_BASE + index, KINDS[index % len(KINDS)]).sound)
              for index in range(cfg.pool_clips)]
    return torch.stack(tracks)


@torch.no_grad()
def tone_accuracy(autoencoder: Any, num_eval: int) -> dict[str, float]:
    """Held-out motion clips: the share whose reconstruction (posterior mode) reads as the
    clip's colour, and the latents' std (the sampler starts from unit noise)."""
    autoencoder.eval()
    hits, latents = [], []
    for seed in range(num_eval):
        clip = make_clip(seed, "motion")
        track = padded_track(clip.sound)[None]
        latent = encode(autoencoder, track, sample=False)
        decoded = autoencoder.decode(latent)[0, :, :clip.sound.shape[-1]].numpy()
        hits.append(dominant_tone(decoded, clip.sample_rate_hz)[0] == clip.scene.colour)
        latents.append(latent)
    autoencoder.train()
    return {"tone": sum(hits) / len(hits), "latent_std": float(torch.cat(latents).std())}


def train_sound(cfg: SoundTrainConfig, log: Any = print) -> tuple[Any, dict[str, Any]]:
    """Returns the trained autoencoder (encoder and decoder) and its training record."""
    autoencoder = build_autoencoder(cfg.seed).train()
    pool = build_pool(cfg)
    rng = np.random.default_rng([13, cfg.seed])
    optimiser = torch.optim.AdamW(autoencoder.parameters(), lr=cfg.learning_rate)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimiser, lambda step: 0.5 * (1 + np.cos(np.pi * min(step / cfg.steps, 1.0))))
    history, start = [], time.process_time()
    for step in range(1, cfg.steps + 1):
        batch = pool[torch.from_numpy(rng.integers(len(pool), size=cfg.batch_size))]
        optimiser.zero_grad(set_to_none=True)
        loss = sound_loss(autoencoder, batch, cfg)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(autoencoder.parameters(), 1.0)
        optimiser.step()
        schedule.step()
        if step % cfg.eval_every == 0 or step == cfg.steps:
            entry = {"step": step, "loss": round(float(loss.detach()), 5),
                     "train_cpu_s": round(time.process_time() - start, 1),
                     **tone_accuracy(autoencoder, cfg.num_eval)}
            history.append(entry)
            log(entry)
    autoencoder.eval()
    return autoencoder, {"config": asdict(cfg), "history": history,
                         "cpu_min": round((time.process_time() - start) / 60, 1)}


def save(autoencoder: Any, record: dict[str, Any], path: Any) -> None:
    from safetensors.torch import save_file

    tensors = {k: v.detach().contiguous() for k, v in autoencoder.state_dict().items()}
    save_file(tensors, str(path), metadata={"training": json.dumps(record)})


def load(path: Any) -> tuple[Any, dict[str, Any]]:
    """The autoencoder `save` wrote (eval mode) and its training record."""
    from safetensors import safe_open

    autoencoder = build_autoencoder(0)
    with safe_open(str(path), framework="pt") as handle:
        state = {k: handle.get_tensor(k) for k in handle.keys()}
        record = json.loads((handle.metadata() or {})["training"])
    autoencoder.load_state_dict(state, strict=True)
    return autoencoder.eval(), record


def main(argv: list[str] | None = None) -> None:
    from pathlib import Path

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=SoundTrainConfig.steps)
    parser.add_argument("--eval-every", type=int, default=SoundTrainConfig.eval_every)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    cfg = SoundTrainConfig(steps=args.steps, eval_every=args.eval_every)
    autoencoder, record = train_sound(cfg, lambda e: print(json.dumps(e), flush=True))
    save(autoencoder, record, args.out)
    print(f"wrote {args.out} ({record['cpu_min']} CPU-min)")


if __name__ == "__main__":
    main()
