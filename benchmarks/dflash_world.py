"""DFlash on the world reasoner: the trained drafter's acceptance and decode speed, lossless.

Drives the reasoner engine in-process (the stage loop's submit/step calls, no sockets) on
`<dev-models>/world` (built on first use), three arms in one process, interleaved:

  plain           no speculation;
  dflash-random   a seeded random drafter of the same shape as the trained one;
  dflash-world    the drafter trained against this reasoner (`<dev-models>/world-drafter`,
                  tools/world_training/train_drafter.py).

Workload: held-out clips (seeds 0..clips-1, below train_reasoner.TRAIN_SEED_BASE), each asked
every question of the grammar (colour, shape, direction, background, and "describe the clip.")
as a chat completion with the clip as a video part, greedy, max_tokens 16. Per arm: mean
acceptance length (tokens per target decode forward: accepted drafts + 1), drafts accepted /
drafted, decode tokens per CPU second and its ratio to plain. Decode time is the process's CPU
time in the engine steps after each request's first (which prefills the clip and samples the
first token; it is the same work in every arm), the least of `--repeats` runs: CPU time, not
wall time, because the machine is shared. Every reply is asserted identical to plain decode's.

    python benchmarks/dflash_world.py [--clips 20] [--repeats 3]

Prints one JSON line per arm and a summary line.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import tempfile
import time
from pathlib import Path

import torch
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from worldserve import envs  # noqa: E402
from worldserve.config import ReasonerStageConfig, ServerConfig, StreamingConfig  # noqa: E402
from worldserve.ipc.capabilities import ReasonerSampling  # noqa: E402
from worldserve.ipc.messages import ChatCompletion, ChatMessage, ChatPart  # noqa: E402
from worldserve.models.dev.world.grammar import QUESTIONS  # noqa: E402
from worldserve.models.dev.world.scenes import make_clip  # noqa: E402

CAPABILITIES = ("colour", "shape", "direction", "background", "caption")
MAX_TOKENS = 16
SPEC_NUM_TOKENS = 7  # the trained drafter's block_size - 1


def greedy(max_tokens: int) -> ReasonerSampling:
    return ReasonerSampling(max_tokens=max_tokens, temperature=0.0, top_p=1.0,
                            repetition_penalty=1.0)


def _png(frame) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(frame).save(buffer, format="PNG")
    return buffer.getvalue()


def world_questions(num_clips: int) -> list[list[ChatMessage]]:
    """Each grammar question about each held-out clip, the clip as a video part."""
    requests = []
    for seed in range(num_clips):
        clip = make_clip(seed, "motion")
        video = ChatPart(type="video", frames=[_png(f) for f in clip.frames], fps=clip.fps)
        requests += [[ChatMessage(role="user", parts=[
            video, ChatPart(type="text", text=QUESTIONS[c][0])])] for c in CAPABILITIES]
    return requests


class Arm:
    """One reasoner engine (with or without a drafter) answering chat completions."""

    def __init__(self, name: str, model_dir: Path, drafter: Path | None) -> None:
        from worldserve.engines.reasoner.engine import ReasonerEngine

        # up to block_size - 1 drafts a step (the config's default is 3): a caption's 7 tokens
        # after its first fit in one block
        streaming = (StreamingConfig(spec_method="dflash", spec_model_path=drafter,
                                     spec_num_tokens=SPEC_NUM_TOKENS)
                     if drafter else StreamingConfig())
        self.name = name
        self.engine = ReasonerEngine(ReasonerStageConfig(model_path=model_dir,
                                                         streaming=streaming), ServerConfig())
        self._seq = 0

    def answer(self, requests: list[list[ChatMessage]], max_tokens: int) -> dict:
        """Each request in turn: replies, completion tokens, forwards, the drafter's counters
        and the CPU seconds of the decode steps (every engine step after a request's first,
        which prefills and samples the first token)."""
        before = dict(self.engine.stats()["extra"])
        replies, tokens, decode_s = [], 0, 0.0
        for messages in requests:
            self._seq += 1
            out: list = []
            self.engine.submit(ChatCompletion(request_id=f"r{self._seq}", messages=messages,
                                              sampling=greedy(max_tokens)), out.append)
            self.engine.step()
            start = time.process_time()
            while self.engine.has_work():
                self.engine.step()
            decode_s += time.process_time() - start
            replies.append(out[-1].text)
            tokens += out[-1].completion_tokens
        after = self.engine.stats()["extra"]
        counts = {k: after[k] - before.get(k, 0)
                  for k in ("forwards", "spec_drafted", "spec_accepted") if k in after}
        return {"decode_s": decode_s, "replies": replies, "tokens": tokens, **counts}


def measure(arm: Arm, requests: list[list[ChatMessage]], repeats: int) -> dict:
    runs = [arm.answer(requests, MAX_TOKENS) for _ in range(repeats)]
    decoded = runs[0]["tokens"] - len(requests)  # the tokens after each reply's first
    forwards = runs[0]["forwards"] - len(requests)  # one prefill forward each
    row = {"arm": arm.name, "requests": len(requests), "decoded_tokens": decoded,
           "decode_forwards": forwards,
           "acceptance_length": round(decoded / max(forwards, 1), 3),
           "decode_tokens_per_cpu_s": round(decoded / min(r["decode_s"] for r in runs), 1),
           "replies": runs[0]["replies"]}
    if "spec_drafted" in runs[0]:
        row["accepted_over_drafted"] = round(
            runs[0]["spec_accepted"] / max(runs[0]["spec_drafted"], 1), 3)
    return row


def world_paths() -> tuple[Path, Path]:
    """`<dev-models>/world` and `<dev-models>/world-drafter` (built when missing)."""
    from worldserve.models.dev import build_dev_models, dev_model_ready

    root = envs.dev_models_dir()
    if not all(dev_model_ready(root / n, n) for n in ("world", "world-drafter")):
        build_dev_models(root)
    return root / "world", root / "world-drafter"


def random_drafter_like(trained: Path) -> Path:
    """A seeded random drafter with the trained drafter's config (its baseline)."""
    from transformers import AutoConfig

    from worldserve.models.dflash.dev import new_drafter

    target = Path(tempfile.mkdtemp(prefix="bench-random-world-drafter-"))
    new_drafter(AutoConfig.from_pretrained(trained), 0).save_pretrained(target)
    return target


def run(num_clips: int, repeats: int) -> dict:
    model_dir, trained = world_paths()
    arms = [Arm("plain", model_dir, None),
            Arm("dflash-random", model_dir, random_drafter_like(trained)),
            Arm("dflash-world", model_dir, trained)]
    requests = world_questions(num_clips)
    for arm in arms:
        arm.answer(requests[:5], MAX_TOKENS)  # warm-up
    rows = {arm.name: measure(arm, requests, repeats) for arm in arms}
    plain = rows["plain"]
    replies = {name: row.pop("replies") for name, row in rows.items()}
    for name, row in rows.items():
        row["replies_identical_to_plain"] = replies[name] == replies["plain"]
        row["decode_speedup_vs_plain"] = round(
            row["decode_tokens_per_cpu_s"] / plain["decode_tokens_per_cpu_s"], 3)
        print(json.dumps(row), flush=True)
    assert all(r["replies_identical_to_plain"] for r in rows.values()), "a reply changed"
    return {"model": str(model_dir), "drafter": str(trained), "clips": num_clips,
            "threads": torch.get_num_threads(),
            **{f"{name}_{k}": rows[name][k] for name in ("dflash-random", "dflash-world")
               for k in ("acceptance_length", "decode_speedup_vs_plain")}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clips", type=int, default=20, help="held-out clips (5 questions each)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(json.dumps(run(args.clips, args.repeats)), flush=True)


if __name__ == "__main__":
    main()
