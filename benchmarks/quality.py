"""Quality per capability through the real server, scored by the dev world's evaluator (issue
30 item 3; docs/dev-world.md).

Prompts and clips come from the world's grammar with a seed (`--num-prompts` of each, >= 100 for
a figure worth reporting); every reply is scored by pixel / sample statistics or exact match:
  evaluator   the evaluator on its generator's own clips (no server): the ceiling of the rest;
  image       POST /v1/images/generations "a <colour> <shape> on <background>": colour, shape,
              background of the image;
  video       POST /v1/videos/sync "... moving <direction>" (with sound): direction, colour,
              and the sound's tone when the server returns an audio track;
  reasoner    POST /v1/chat/completions, a world clip as a `video_url` (all its frames:
              `media_io_kwargs.video.fps` = the clip's fps) and one question per capability:
              exact answers.
Not yet measured here: the action modes and realtime sessions (WebSocket), streaming reasoning.
Each figure sits beside its chance level. On today's random-weight dev models every figure is
chance level (or below: an empty or noisy frame reads as no shape); the figures mean something
once the dev models are trained on the world (issue 30 item 2).

    .venv/bin/python benchmarks/quality.py [--num-prompts 100] [--base-url http://HOST:PORT]

Without `--base-url` it builds the dev models and serves `<dev-models>/generation` (the Cosmos3
generator and its reasoner). Prints one JSON line.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from worldserve import envs  # noqa: E402
from worldserve.media.video import decode_audio, decode_frames, encode_mp4  # noqa: E402
from worldserve.models.dev.world import evaluate  # noqa: E402
from worldserve.models.dev.world.grammar import (  # noqa: E402
    QUESTIONS,
    answer,
    parse_prompt,
    sample_prompts,
)
from worldserve.models.dev.world.scenes import WorldConfig, make_clip  # noqa: E402
from worldserve.models.dev.world.selfcheck import evaluator_accuracy  # noqa: E402

CFG = WorldConfig()
SIZE = f"{CFG.width_px}x{CFG.height_px}"
CHANCE = {"colour": 1 / 4, "shape": 1 / 3, "background": 1 / 2, "direction": 1 / 5,
          "tone": 1 / 4, "caption": 1 / 240}
REASONER_CAPABILITIES = ("colour", "shape", "direction", "background", "caption")


def image_arm(client: httpx.Client, prompts: list[str], seed: int) -> dict[str, float]:
    hits: dict[str, list[bool]] = {"colour": [], "shape": [], "background": []}
    for index, prompt in enumerate(prompts):
        reply = _post(client, "/v1/images/generations", {
            "prompt": prompt, "size": SIZE, "seed": seed + index, "response_format": "b64_json"})
        data = base64.b64decode(reply.json()["data"][0]["b64_json"])
        reading = evaluate.read_frame(np.asarray(Image.open(io.BytesIO(data)).convert("RGB")))
        _score(hits, parse_prompt(prompt), reading)
    return _rates(hits)


def video_arm(client: httpx.Client, prompts: list[str], seed: int) -> dict[str, float]:
    hits: dict[str, list[bool]] = {"colour": [], "shape": [], "direction": [], "tone": []}
    for index, prompt in enumerate(prompts):
        reply = _post(client, "/v1/videos/sync", {
            "prompt": prompt, "size": SIZE, "seed": seed + index, "num_frames": CFG.num_frames,
            "fps": int(CFG.fps), "generate_sound": True})
        labels = parse_prompt(prompt)
        _score(hits, labels, evaluate.read_clip(np.stack(decode_frames(reply.content))))
        audio = decode_audio(reply.content)
        if audio is not None and audio[0].shape[-1] > 0:
            hits["tone"].append(evaluate.dominant_tone(*audio)[0] == labels.colour)
    return _rates(hits)


def reasoner_arm(client: httpx.Client, num_clips: int, seed: int) -> dict[str, float]:
    hits: dict[str, list[bool]] = {c: [] for c in REASONER_CAPABILITIES}
    models = client.get("/v1/models").json()["data"]
    model = next(m["id"] for m in models if "reasoner" in m["stages"])
    for index in range(num_clips):
        clip = make_clip(seed + index, "motion", CFG)
        mp4 = io.BytesIO()
        encode_mp4(clip.frames, int(clip.fps), mp4, compression=100)
        url = "data:video/mp4;base64," + base64.b64encode(mp4.getvalue()).decode()
        for capability in REASONER_CAPABILITIES:
            content = [{"type": "video_url", "video_url": {"url": url}},
                       {"type": "text", "text": QUESTIONS[capability][0]}]
            reply = _post(client, "/v1/chat/completions", {
                "model": model, "messages": [{"role": "user", "content": content}],
                "max_tokens": 16, "temperature": 0.0,
                "media_io_kwargs": {"video": {"fps": clip.fps}}})
            text = reply.json()["choices"][0]["message"]["content"] or ""
            hits[capability].append(evaluate.answer_matches(text, answer(clip, capability)))
    return _rates(hits)


def _post(client: httpx.Client, path: str, body: dict[str, Any]) -> httpx.Response:
    reply = client.post(path, json=body)
    if reply.status_code != 200:
        raise RuntimeError(f"POST {path}: {reply.status_code} {reply.text[:500]}")
    return reply


def _score(hits: dict[str, list[bool]], labels: Any, reading: Any) -> None:
    for label in ("colour", "shape", "background", "direction"):
        if label in hits and getattr(labels, label) is not None:
            hits[label].append(getattr(reading, label) == getattr(labels, label))


def _rates(hits: dict[str, list[bool]]) -> dict[str, float]:
    return {name: round(sum(found) / len(found), 3) for name, found in hits.items() if found}


def serve_dev_models(workdir: Path) -> Any:
    from tests.support.server import ServerProcess

    root = envs.dev_models_dir()
    subprocess.run([sys.executable, "-m", "worldserve", "dev-models", "build", str(root)],
                   check=True)
    server = ServerProcess(workdir, args=["--model-path", str(root / "generation")])
    server.wait_healthy(timeout_s=600)
    return server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-prompts", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--base-url", default=None, help="a running server (default: start one)")
    parser.add_argument("--arms", default="evaluator,image,video,reasoner")
    args = parser.parse_args()
    arms = args.arms.split(",")
    result: dict[str, Any] = {"num_prompts": args.num_prompts, "chance": CHANCE}
    if "evaluator" in arms:
        seeds = range(args.seed, args.seed + args.num_prompts)
        result["evaluator"] = {k: round(v, 3) for k, v in evaluator_accuracy(seeds, CFG).items()}
    served = [arm for arm in arms if arm != "evaluator"]
    if served:
        with tempfile.TemporaryDirectory() as workdir:
            server = None if args.base_url else serve_dev_models(Path(workdir))
            try:
                base_url = args.base_url or server.base_url
                with httpx.Client(base_url=base_url, timeout=600) as client:
                    result.update(_served_arms(client, served, args))
            finally:
                if server is not None:
                    server.stop()
    print(json.dumps(result))


def _served_arms(client: httpx.Client, arms: list[str], args: argparse.Namespace) -> dict:
    out: dict[str, Any] = {}
    if "image" in arms:
        out["image"] = image_arm(client, sample_prompts(args.seed, args.num_prompts, "image"),
                                 args.seed)
    if "video" in arms:
        out["video"] = video_arm(client, sample_prompts(args.seed, args.num_prompts), args.seed)
    if "reasoner" in arms:
        out["reasoner"] = reasoner_arm(client, args.num_prompts, args.seed)
    return out


if __name__ == "__main__":
    main()
