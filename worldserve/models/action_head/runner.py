"""Action generation with the checkpoint's flow-matching action head (`<model>/action_head/`).

`ActionRunner` satisfies the generation stage's action-runner contract
(engines/generation/contract.py).
"""

from __future__ import annotations

import io
import time
from pathlib import Path
from typing import Any

import numpy as np

from worldserve.errors import InvalidRequest
from worldserve.ipc.messages import ActionsResult, GenerateActions
from worldserve.models.action_head.model import load_action_head

MAX_CANDIDATES = 16


def load_runner(head_dir: Path) -> ActionRunner:
    """The registry's actions loader for an action-head directory."""
    return ActionRunner(load_action_head(head_dir), head_dir)


class ActionRunner:
    def __init__(self, head: Any, path: Path) -> None:
        self.head = head
        self.path = path
        self.config = head.config

    def metadata(self) -> dict[str, Any]:
        c = self.config
        return {"action_horizon": c.action_horizon, "action_dim": c.action_dim,
                "state_dim": c.state_dim, "image_size": c.image_size, "max_images": c.max_images,
                "num_inference_steps": c.default_steps, "max_candidates": MAX_CANDIDATES}

    def run(self, msg: GenerateActions) -> ActionsResult:
        import torch

        c = self.config
        started = time.perf_counter()
        horizon = msg.action_horizon or c.action_horizon
        if horizon != c.action_horizon:
            raise InvalidRequest(f"action_horizon must be {c.action_horizon} for this action head "
                                 f"(got {horizon})", param="action_horizon")
        if len(msg.images) > c.max_images:
            raise InvalidRequest(f"this action head accepts at most {c.max_images} images",
                                 param="observation.images")
        if not 1 <= msg.num_candidates <= MAX_CANDIDATES:
            raise InvalidRequest(f"candidate_count must be in 1..{MAX_CANDIDATES}",
                                 param="candidate_count")
        steps = msg.num_inference_steps or c.default_steps
        images = torch.stack([self._image(data) for data in msg.images]) if msg.images else \
            torch.zeros((0, 3, c.image_size, c.image_size))
        state = np.frombuffer(msg.state, dtype="<f4") if msg.state else np.zeros(c.state_dim, "<f4")
        if state.size != c.state_dim:
            raise InvalidRequest(f"observation.state must have {c.state_dim} values "
                                 f"(got {state.size})", param="observation.state")
        noise = self._noise(msg, c)
        with torch.inference_mode():
            cond = self.head.condition(images, torch.from_numpy(state.copy()), msg.task)
            actions = self.head.sample(cond, noise, steps)
        values = actions.numpy().astype("<f4")
        return ActionsResult(request_id=msg.request_id, values=values.tobytes(),
                             num_candidates=values.shape[0], action_horizon=c.action_horizon,
                             action_dim=c.action_dim, num_inference_steps=steps,
                             infer_ms=(time.perf_counter() - started) * 1000)

    def _image(self, data: bytes) -> Any:
        import torch
        from PIL import Image

        size = self.config.image_size
        img = Image.open(io.BytesIO(data)).convert("RGB").resize((size, size), Image.BILINEAR)
        arr = np.asarray(img, dtype=np.float32) / 127.5 - 1.0
        return torch.from_numpy(arr).permute(2, 0, 1)

    def _noise(self, msg: GenerateActions, c: Any) -> Any:
        import torch

        shape = (msg.num_candidates, c.action_horizon, c.action_dim)
        if msg.noise:
            noise = np.frombuffer(msg.noise, dtype="<f4")
            if noise.size != c.action_horizon * c.action_dim:
                raise InvalidRequest(f"observation.noise must have shape [{c.action_horizon}, "
                                     f"{c.action_dim}]", param="observation.noise")
            return torch.from_numpy(np.broadcast_to(noise.reshape(shape[1:]), shape).copy())
        generator = torch.Generator().manual_seed(msg.seed)
        return torch.randn(shape, generator=generator)
