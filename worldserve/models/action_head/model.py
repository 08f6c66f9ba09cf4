"""A tiny flow-matching action head: observation images + state + task -> action chunk.

Shape of a VLA policy's action expert (pi0-style): an observation encoder produces a condition
vector; a velocity network denoises an `action_horizon x action_dim` chunk from Gaussian noise
(t = 1) to actions (t = 0) with Euler steps. Random weights: the outputs are meaningless, the
serving path is real (the dev builder is in `dev.py`). Saved as `config.json` +
`model.safetensors` in `<generation>/action_head/`.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"


@dataclass(frozen=True)
class ActionHeadConfig:
    action_dim: int = 7
    action_horizon: int = 16
    state_dim: int = 8
    image_size: int = 32  # observations are resized to image_size x image_size
    max_images: int = 4
    hidden: int = 64
    num_layers: int = 2
    default_steps: int = 10


class ActionHead(nn.Module):
    def __init__(self, config: ActionHeadConfig) -> None:
        super().__init__()
        self.config = config
        c = config
        self.image_proj = nn.Conv2d(3, c.hidden, kernel_size=8, stride=8)  # (N, 3, S, S) -> patches
        self.state_proj = nn.Linear(c.state_dim, c.hidden)
        self.text_embed = nn.Embedding(256, c.hidden)  # bytes of the task string
        self.time_proj = nn.Linear(c.hidden, c.hidden)
        layers: list[nn.Module] = [nn.Linear(c.action_horizon * c.action_dim + c.hidden, c.hidden)]
        for _ in range(c.num_layers):
            layers += [nn.SiLU(), nn.Linear(c.hidden, c.hidden)]
        layers += [nn.SiLU(), nn.Linear(c.hidden, c.action_horizon * c.action_dim)]
        self.velocity = nn.Sequential(*layers)

    def condition(self, images: torch.Tensor, state: torch.Tensor, task: str) -> torch.Tensor:
        """images (N, 3, S, S) in [-1, 1], state (state_dim,) -> condition (hidden,)."""
        parts = []
        if images.shape[0]:
            parts.append(self.image_proj(images).mean(dim=(0, 2, 3)))
        parts.append(self.state_proj(state))
        data = task.encode("utf-8")[:256] or b" "
        parts.append(self.text_embed(torch.tensor(list(data))).mean(dim=0))
        return torch.stack(parts).sum(dim=0)

    def _time_embedding(self, t: torch.Tensor) -> torch.Tensor:  # t: (B,) -> (B, hidden)
        half = self.config.hidden // 2
        freqs = torch.exp(-math.log(1000.0) * torch.arange(half) / half)
        args = t[:, None] * 1000.0 * freqs[None]
        return self.time_proj(torch.cat([args.sin(), args.cos()], dim=-1))

    @torch.inference_mode()
    def sample(self, cond: torch.Tensor, noise: torch.Tensor, num_steps: int) -> torch.Tensor:
        """Euler flow from noise (B, H, A) at t=1 to actions at t=0."""
        batch = noise.shape[0]
        x = noise.reshape(batch, -1)
        dt = 1.0 / num_steps
        for i in range(num_steps):
            t = torch.full((batch,), 1.0 - i * dt)
            h = cond[None].expand(batch, -1) + self._time_embedding(t)
            v = self.velocity(torch.cat([x, h], dim=-1))
            x = x - dt * v
        return x.reshape(noise.shape)


def save_action_head(head: ActionHead, target: Path) -> None:
    from safetensors.torch import save_file

    target.mkdir(parents=True, exist_ok=True)
    (target / CONFIG_NAME).write_text(json.dumps(asdict(head.config), indent=2) + "\n")
    save_file({k: v.contiguous() for k, v in head.state_dict().items()}, str(target / WEIGHTS_NAME))


def load_action_head(path: Path) -> ActionHead:
    from safetensors.torch import load_file

    config = ActionHeadConfig(**json.loads((path / CONFIG_NAME).read_text()))
    head = ActionHead(config)
    head.load_state_dict(load_file(str(path / WEIGHTS_NAME)))
    return head.eval()
