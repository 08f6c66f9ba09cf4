"""The trained dev-world weights that ship with worldserve, and how a dev build applies them.

One safetensors file (`weights/cosmos3_world.safetensors`, a few MB) holds what training on
the dev world changed in the dev Cosmos3 directory: `transformer.*` (the generator, whose
understanding pathway is also the reasoner's LLM), `vae.*`, `sound.*` (the sound tokenizer's
decoder) and `reasoner.*` (the reasoner's own tensors: vision tower and merger; its LLM is
copied from the generator at build time, as every Cosmos3 dev build does). The VAE's latent
statistics ride in the file's metadata, and `weights/cosmos3_world.json` records how the
weights were made and what they measured. `dev-models build` writes the `world/` directory from
it in seconds; nothing trains at build or test time (`python -m tools.world_training.retrain`
re-runs the training).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

WEIGHTS_DIR = Path(__file__).parent / "weights"
WEIGHTS_PATH = WEIGHTS_DIR / "cosmos3_world.safetensors"
MANIFEST_PATH = WEIGHTS_PATH.with_suffix(".json")  # what `write` puts beside a weights file
TRANSFORMER, VAE, SOUND, REASONER = "transformer.", "vae.", "sound.", "reasoner."
REASONER_WEIGHTS = "model.safetensors"  # the reasoner's file at a Cosmos3 directory's root


class MissingWeights(FileNotFoundError):
    """The shipped weights are not in this install."""


def read(path: Path = WEIGHTS_PATH) -> tuple[dict[str, Any], dict[str, str]]:
    """The tensors and metadata of a weights file (the shipped one by default)."""
    from safetensors import safe_open

    if not Path(path).is_file():
        raise MissingWeights(f"the trained dev-world weights are missing: {path} "
                             "(run `python -m tools.world_training.retrain` to make them)")
    with safe_open(str(path), framework="pt") as handle:
        return {k: handle.get_tensor(k) for k in handle.keys()}, dict(handle.metadata() or {})


def part(tensors: dict[str, Any], prefix: str) -> dict[str, Any]:
    """The tensors under `prefix`, named without it."""
    return {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}


def apply_vision(pipe: Any, tensors: dict[str, Any], metadata: dict[str, str]) -> None:
    """Load the transformer and VAE of a weights file (strictly) and the VAE's statistics."""
    pipe.transformer.load_state_dict(part(tensors, TRANSFORMER), strict=True)
    pipe.vae.load_state_dict(part(tensors, VAE), strict=True)
    pipe.vae.register_to_config(latents_mean=json.loads(metadata["latents_mean"]),
                                latents_std=json.loads(metadata["latents_std"]))


def apply_to_pipeline(pipe: Any, weights: Path = WEIGHTS_PATH) -> None:
    """Load the trained transformer, VAE and sound tokenizer into a freshly built dev pipeline
    (strictly: every tensor, same shapes) and give the VAE its latent statistics."""
    tensors, metadata = read(weights)
    apply_vision(pipe, tensors, metadata)
    pipe.sound_tokenizer.load_state_dict(part(tensors, SOUND), strict=True)


def apply_to_reasoner_files(target: Path, weights: Path = WEIGHTS_PATH) -> None:
    """Overwrite the reasoner's own tensors in `target`'s reasoner checkpoint (written by
    `write_reasoner_files`, which copied the trained LLM from the generator)."""
    from safetensors.torch import load_file, save_file

    path = Path(target) / REASONER_WEIGHTS
    saved = load_file(str(path))
    trained = part(read(weights)[0], REASONER)
    for name, tensor in trained.items():
        if name not in saved or saved[name].shape != tensor.shape:
            raise ValueError(f"the trained reasoner tensor {name} does not fit {path}")
        saved[name] = tensor
    save_file(saved, str(path), metadata={"format": "pt"})


def save(transformer: Any, vae: Any, sound: Any, built_reasoner: Path, trained_reasoner: Path,
         latents_mean: list[float], latents_std: list[float], manifest: dict[str, Any]) -> None:
    """Write the weights file and its manifest. `trained_reasoner` is the trained reasoner's
    checkpoint file; `built_reasoner` the one a dev build writes beside the trained generator
    (its LLM copied from it): the reasoner tensors kept are those that differ, so its own."""
    import torch
    from safetensors.torch import load_file

    tensors = {TRANSFORMER + k: v for k, v in transformer.state_dict().items()}
    tensors.update({VAE + k: v for k, v in vae.state_dict().items()})
    tensors.update({SOUND + k: v for k, v in sound.state_dict().items()})
    built, trained = load_file(str(built_reasoner)), load_file(str(trained_reasoner))
    if built.keys() != trained.keys():
        raise ValueError("the trained reasoner's tensors are not the dev build's")
    tensors.update({REASONER + k: v for k, v in trained.items()
                    if not torch.equal(v, built[k])})
    write(tensors, {"latents_mean": json.dumps(latents_mean),
                    "latents_std": json.dumps(latents_std)}, manifest)


def write(tensors: dict[str, Any], metadata: dict[str, str], manifest: dict[str, Any],
          path: Path = WEIGHTS_PATH) -> None:
    """Write a weights file (tensors named with their part's prefix; the shipped one by
    default) and its manifest beside it (the same name, `.json`)."""
    from safetensors.torch import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().contiguous() for k, v in tensors.items()}, str(path),
              metadata=metadata)
    path.with_suffix(".json").write_text(json.dumps(manifest, indent=2) + "\n",
                                         encoding="utf-8")
