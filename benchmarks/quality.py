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
  stream      live REST sessions over stream clips: the colour on screen now;
  action      Cosmos3's action modes on agent clips (camera_pose deltas, tier 256, 12 steps,
              guidance 3): forward dynamics (POST /v1/videos/sync with the first frame and
              the keys) scored by the evaluator's action response, inverse dynamics (POST
              /v1/actions/generations with the clip) by each predicted delta read back as a
              screen step against the held keys.
  realtime    WS /v1/realtime_video/generate sessions from agent clips (the clip's first frame
              as the session's first frame when the realtime model is image-conditioned, else
              its prompt alone): 3 chunks, one of w/a/s/d held per chunk, flipping to the
              opposite key every chunk, scored per chunk by the evaluator's action response
              (moved the commanded way within the chunk) and colour; first-chunk latency and
              the interval between chunks.
Each figure sits beside its chance level. On today's random-weight dev models every figure is
chance level (or below: an empty or noisy frame reads as no shape); the figures mean something
once the dev models are trained on the world (issue 30 item 2).

    .venv/bin/python benchmarks/quality.py [--num-prompts 100] [--base-url http://HOST:PORT]

Without `--base-url` it builds the dev models and serves `<dev-models>/world` (the Cosmos3
generator and its reasoner) and the realtime stage's default `<dev-models>/realtime`, or
`--realtime-model-path DIR`. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.support import world_client  # noqa: E402
from worldserve import envs  # noqa: E402
from worldserve.models.dev.world import evaluate  # noqa: E402
from worldserve.models.dev.world.agent import screen_step, screen_step_of_pose  # noqa: E402
from worldserve.models.dev.world.grammar import (  # noqa: E402
    QUESTIONS,
    answer,
    describe,
    parse_prompt,
    sample_prompts,
)
from worldserve.models.dev.world.render import png_bytes  # noqa: E402
from worldserve.models.dev.world.scenes import WorldConfig, make_clip  # noqa: E402
from worldserve.models.dev.world.selfcheck import evaluator_accuracy  # noqa: E402
from worldserve.models.dev.world.vocab import KEY_STEPS, OPPOSITE_KEYS, direction_of  # noqa: E402

CFG = WorldConfig()
CHANCE = {"colour": 1 / 4, "shape": 1 / 3, "background": 1 / 2, "direction": 1 / 5,
          "tone": 1 / 4, "caption": 1 / 240, "realtime_response": 1 / 4}
REASONER_CAPABILITIES = ("colour", "shape", "direction", "background", "caption")
# Realtime sessions: a key, its opposite, the key again. The agent starts in the middle half of
# its room (>= 9 px from each edge), so each chunk of the world's own roll-out has room to move
# the commanded way: the first chunk moves it at most 24 px, each flip moves it back first.
REALTIME_CHUNKS = 3


def image_arm(client: httpx.Client, prompts: list[str], seed: int) -> dict[str, float]:
    hits: dict[str, list[bool]] = {"colour": [], "shape": [], "background": []}
    for index, prompt in enumerate(prompts):
        _score(hits, parse_prompt(prompt), world_client.draw(client, prompt, seed + index))
    return _rates(hits)


def video_arm(client: httpx.Client, prompts: list[str], seed: int) -> dict[str, float]:
    hits: dict[str, list[bool]] = {"colour": [], "shape": [], "direction": [], "tone": []}
    for index, prompt in enumerate(prompts):
        labels = parse_prompt(prompt)
        reading, tone = world_client.film(client, prompt, seed + index)
        _score(hits, labels, reading)
        if tone is not None:
            hits["tone"].append(tone == labels.colour)
    return _rates(hits)


def reasoner_arm(client: httpx.Client, num_clips: int, seed: int) -> dict[str, float]:
    hits: dict[str, list[bool]] = {c: [] for c in REASONER_CAPABILITIES}
    model = world_client.reasoner_model(client)
    for index in range(num_clips):
        clip = make_clip(seed + index, "motion", CFG)
        for capability in REASONER_CAPABILITIES:
            text = world_client.ask(client, model, clip, QUESTIONS[capability][0])
            hits[capability].append(evaluate.answer_matches(text, answer(clip, capability)))
    return _rates(hits)


def stream_arm(client: httpx.Client, num_clips: int, seed: int) -> dict[str, float]:
    """Live sessions over stream clips (the colour changes every 4 frames): the share of
    frames whose reply names the colour on screen, and the same allowing the 2 frames after a
    change to lag (the aim: the current colour within 2 frames of a change)."""
    exact, settled = [], []
    for index in range(num_clips):
        clip = make_clip(seed + index, "stream", CFG)
        replies = world_client.watch(client, list(clip.frames), QUESTIONS["colour_now"][0])
        colours = clip.colour_per_frame
        for frame, (reply, colour) in enumerate(zip(replies, colours)):
            correct = evaluate.answer_matches(reply, colour)
            exact.append(correct)
            changed = any(colours[j] != colours[j - 1] for j in range(max(1, frame - 1), frame + 1))
            if frame == 0 or not changed:
                settled.append(correct)
    return {"colour_now": _rate(exact), "colour_now_settled": _rate(settled)}


def action_arm(client: httpx.Client, num_clips: int, seed: int) -> dict[str, float]:
    """Held-out agent clips (seeds `seed`..): the share of forward-dynamics videos whose agent
    moves as the keys command, and of inverse-dynamics steps whose delta is the keys' step."""
    response, steps_hit = [], []
    for index in range(num_clips):
        clip = make_clip(seed + index, "agent", CFG)
        frames = world_client.roll(client, clip, seed + index)
        response.append(evaluate.action_response(frames, clip.keys_per_step, CFG.step_px))
        poses = world_client.invert(client, clip, seed + index)
        steps_hit += [screen_step_of_pose(pose) == screen_step(keys)
                      for pose, keys in zip(poses, clip.keys_per_step)]
    return {"forward_response": _rate(response), "inverse_step_keys": _rate(steps_hit)}


def realtime_arm(base_url: str, num_clips: int, seed: int, first_frame: str) -> dict[str, Any]:
    """Realtime sessions over held-out agent clips (module docstring). A first session of 2
    chunks without keys learns the chunk sizes (the script is per output frame) and whether
    the model takes the first frame (`first_frame` "auto"); it also warms the stage, so it is
    not timed."""
    probe = world_client.explore(
        base_url, _realtime_init(make_clip(seed, "agent", CFG), seed, first_frame != "no", 2),
        drop_refused_first_frame=first_frame == "auto")
    sizes = [len(chunk) for chunk in probe.chunks]
    chunk_frames = sizes + sizes[-1:] * (REALTIME_CHUNKS - len(sizes))
    rng = np.random.default_rng(seed)
    moved: list[list[bool]] = [[] for _ in chunk_frames]
    kept, first_ms, interval_ms = [], [], []
    for index in range(num_clips):
        clip = make_clip(seed + index, "agent", CFG)
        keys = chunk_keys("wasd"[int(rng.integers(4))], REALTIME_CHUNKS)
        script = [[key] for key, frames in zip(keys, chunk_frames) for _ in range(frames)]
        run = world_client.explore(base_url, _realtime_init(
            clip, seed + index, probe.from_first_frame, REALTIME_CHUNKS, script))
        reference = None
        for chunk_index, (chunk, key) in enumerate(zip(run.chunks, keys)):
            response, colour = score_chunk(reference, chunk, key, clip.scene.colour)
            moved[chunk_index].append(response)
            kept.append(colour)
            reference = chunk[-1]
        first_ms.append(1000 * run.arrived_s[0])
        interval_ms += list(1000 * np.diff(run.arrived_s))
    return {"first_frame": probe.from_first_frame, "chunk_frames": chunk_frames,
            "response": _rate(sum(moved, [])),
            "response_per_chunk": [_rate(found) for found in moved],
            "colour_kept": _rate(kept), "first_chunk_ms": round(float(np.median(first_ms))),
            "chunk_interval_ms": round(float(np.median(interval_ms)))}


def chunk_keys(first_key: str, num_chunks: int) -> list[str]:
    """The key held in each chunk: `first_key`, its opposite, `first_key`, ..."""
    return [first_key if index % 2 == 0 else OPPOSITE_KEYS[first_key]
            for index in range(num_chunks)]


def score_chunk(reference: np.ndarray | None, chunk: np.ndarray, key: str,
                colour: str) -> tuple[bool, bool]:
    """(the agent moved the way `key` commands, the chunk shows `colour`) for one received chunk
    (T, H, W, 3) held under `key`: the evaluator's action response from `reference` (the
    previous chunk's last frame; None for a session's first chunk, which starts from its own
    frame 0) through the chunk's frames, and the chunk's majority colour.

    The world's roll-out from the agent seen in the first frame must move it the key's way too:
    the sessions' keys leave the world's own agent room in every chunk, so an edge stop means the
    model lost the agent (a noise frame reads as one frame-filling blob, which no key moves, and
    its 'still' would otherwise match the roll-out's 'still')."""
    frames = chunk if reference is None else np.concatenate([reference[None], chunk])
    keys = [[key]] * (len(frames) - 1)
    commanded = direction_of(*KEY_STEPS[key])
    response = (evaluate.expected_agent_direction(frames[0], keys, CFG.step_px) == commanded
                and evaluate.action_response(frames, keys, CFG.step_px))
    return response, evaluate.read_clip(chunk).colour == colour


def _realtime_init(clip: Any, seed: int, with_first_frame: bool, max_chunks: int,
                   script: list[list[str]] | None = None) -> dict[str, Any]:
    init: dict[str, Any] = {
        "type": "init", "prompt": describe(clip.scene, "agent"), "seed": seed,
        "size": world_client.SIZE, "max_chunks": max_chunks, "realtime_output_format": "raw"}
    if script is not None:
        init["condition_inputs"] = {"camera_actions": script}
    if with_first_frame:
        init["first_frame"] = png_bytes(clip.frames[0])
    return init


def _score(hits: dict[str, list[bool]], labels: Any, reading: Any) -> None:
    for label in ("colour", "shape", "background", "direction"):
        if label in hits and getattr(labels, label) is not None:
            hits[label].append(getattr(reading, label) == getattr(labels, label))


def _rate(found: list[bool]) -> float:
    return round(sum(found) / len(found), 3)


def _rates(hits: dict[str, list[bool]]) -> dict[str, float]:
    return {name: _rate(found) for name, found in hits.items() if found}


def serve_dev_models(workdir: Path, realtime_model_path: Path | None = None) -> Any:
    from tests.support.server import ServerProcess

    root = envs.dev_models_dir()
    subprocess.run([sys.executable, "-m", "worldserve", "dev-models", "build", str(root)],
                   check=True)
    config = ({"stages": {"realtime": {"model_path": str(realtime_model_path)}}}
              if realtime_model_path else None)
    server = ServerProcess(workdir, config, args=["--model-path", str(root / "world")])
    server.wait_healthy(timeout_s=600)
    return server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-prompts", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--base-url", default=None, help="a running server (default: start one)")
    parser.add_argument("--arms", default="evaluator,image,video,reasoner,stream,action,realtime")
    parser.add_argument("--realtime-model-path", type=Path, default=None,
                        help="the realtime stage's model directory (default: the dev realtime "
                             "model); ignored with --base-url")
    parser.add_argument("--realtime-first-frame", choices=("auto", "yes", "no"), default="auto",
                        help="start realtime sessions from the clip's first frame: when the "
                             "model accepts one (auto), always, or never (the prompt alone)")
    args = parser.parse_args()
    arms = args.arms.split(",")
    result: dict[str, Any] = {"num_prompts": args.num_prompts, "chance": CHANCE}
    if "evaluator" in arms:
        seeds = range(args.seed, args.seed + args.num_prompts)
        result["evaluator"] = {k: round(v, 3) for k, v in evaluator_accuracy(seeds, CFG).items()}
    served = [arm for arm in arms if arm != "evaluator"]
    if served:
        with tempfile.TemporaryDirectory() as workdir:
            server = (None if args.base_url
                      else serve_dev_models(Path(workdir), args.realtime_model_path))
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
    if "stream" in arms:
        out["stream"] = stream_arm(client, max(1, args.num_prompts // 4), args.seed)
    if "action" in arms:
        out["action"] = action_arm(client, args.num_prompts, args.seed)
    if "realtime" in arms:
        out["realtime"] = realtime_arm(str(client.base_url), args.num_prompts, args.seed,
                                       args.realtime_first_frame)
    return out


if __name__ == "__main__":
    main()
