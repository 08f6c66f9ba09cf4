"""DFlash on the world reasoner: the trained drafter's acceptance and decode speed, lossless.

Drives the reasoner engine in-process (the stage loop's submit/step calls, no sockets) on
`<dev-models>/world` (built on first use), three arms in one process, interleaved:

  plain           no speculation;
  dflash-random   a seeded random drafter of the same shape as the trained one;
  dflash-world    the drafter trained against this reasoner (`<dev-models>/world-drafter`,
                  tools/world_training/train_drafter.py).

Workloads: `chat`, held-out clips (seeds 0..clips-1, below train_reasoner.TRAIN_SEED_BASE),
each asked every question of the grammar (colour, shape, direction, background, and "describe
the clip.") as a chat completion with the clip as a video part; `session`, live sessions over
held-out stream clips (seeds 0..streams-1), "what colour is it now?" answered frame by frame.
Greedy, max_tokens 16. Per arm and workload: mean
acceptance length (tokens per target decode forward: accepted drafts + 1), drafts accepted /
drafted, decode tokens per CPU second and its ratio to plain. Decode time is the process's CPU
time in the engine steps after each request's first (which prefills the clip and samples the
first token; it is the same work in every arm), the least of `--repeats` runs: CPU time, not
wall time, because the machine is shared. Every reply is asserted identical to plain decode's.

    python benchmarks/dflash_world.py [--clips 20] [--streams 5] [--repeats 3]

Prints one JSON line per arm and workload, then a summary line.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from worldserve import envs  # noqa: E402
from worldserve.config import ReasonerStageConfig, ServerConfig, StreamingConfig  # noqa: E402
from worldserve.ipc.capabilities import ReasonerSampling  # noqa: E402
from worldserve.ipc.messages import (  # noqa: E402
    ChatCompletion,
    ChatMessage,
    ChatPart,
    CloseSession,
    CreateSession,
    SessionFrame,
)
from worldserve.models.dev.world.grammar import QUESTIONS  # noqa: E402
from worldserve.models.dev.world.render import png_bytes  # noqa: E402
from worldserve.models.dev.world.scenes import make_clip  # noqa: E402

CAPABILITIES = ("colour", "shape", "direction", "background", "caption")
MAX_TOKENS = 16
# A live session's instructions, as the reasoner was trained with and the world tests send
STREAM_SYSTEM_PROMPT = "Answer in one word."
SPEC_NUM_TOKENS = 7  # the trained drafter's block_size - 1


def greedy(max_tokens: int) -> ReasonerSampling:
    return ReasonerSampling(max_tokens=max_tokens, temperature=0.0, top_p=1.0,
                            repetition_penalty=1.0)


def world_questions(num_clips: int) -> list[list[ChatMessage]]:
    """Each grammar question about each held-out clip, the clip as a video part."""
    requests = []
    for seed in range(num_clips):
        clip = make_clip(seed, "motion")
        video = ChatPart(type="video", frames=[png_bytes(f) for f in clip.frames], fps=clip.fps)
        requests += [[ChatMessage(role="user", parts=[
            video, ChatPart(type="text", text=QUESTIONS[c][0])])] for c in CAPABILITIES]
    return requests


def world_streams(num_clips: int) -> list[list[bytes]]:
    """Held-out stream clips (a colour change every 4 frames): each one live session's frames."""
    return [[png_bytes(f) for f in make_clip(seed, "stream").frames] for seed in range(num_clips)]


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

    def answer(self, requests: list[list[ChatMessage]], sampling: ReasonerSampling) -> dict:
        """Each request in turn: replies, completion tokens, forwards, the drafter's counters
        and the CPU seconds of the decode steps (every engine step after a request's first,
        which prefills and samples the first token)."""
        before = dict(self.engine.stats()["extra"])
        replies, tokens, decode_s = [], 0, 0.0
        for messages in requests:
            self._seq += 1
            out: list = []
            self.engine.submit(ChatCompletion(request_id=f"r{self._seq}", messages=messages,
                                              sampling=sampling), out.append)
            decode_s += self._run()
            replies.append(out[-1].text)
            tokens += out[-1].completion_tokens
        return self._counts(before, decode_s, replies, tokens)

    def watch(self, streams: list[list[bytes]], sampling: ReasonerSampling) -> dict:
        """One live session per stream ("what colour is it now?"), a reply per frame: the same
        figures as `answer` (a frame's first step prefills it and samples its first token)."""
        before = dict(self.engine.stats()["extra"])
        replies, tokens, decode_s = [], 0, 0.0
        retention = self.engine.capabilities().retention
        for frames in streams:
            self._seq += 1
            sid = f"s{self._seq}"
            self.engine.submit(CreateSession(
                request_id=f"c{sid}", session_id=sid, system_prompt=STREAM_SYSTEM_PROMPT,
                question=QUESTIONS["colour_now"][0], retention=retention,
                sampling=sampling), lambda _: None)
            for index, image in enumerate(frames):
                out: list = []
                self.engine.submit(SessionFrame(request_id=f"{sid}:{index}", session_id=sid,
                                                image=image, received_at=time.time()),
                                   out.append)
                decode_s += self._run()
                replies.append(out[-1].text)
                tokens += out[-1].token_count
            self.engine.submit(CloseSession(request_id=f"x{sid}", session_id=sid),
                               lambda _: None)
        return self._counts(before, decode_s, replies, tokens)

    def _run(self) -> float:
        """Run the submitted request; the CPU seconds of its steps after the first."""
        self.engine.step()
        start = time.process_time()
        while self.engine.has_work():
            self.engine.step()
        return time.process_time() - start

    def _counts(self, before: dict, decode_s: float, replies: list[str], tokens: int) -> dict:
        after = self.engine.stats()["extra"]
        counts = {k: after[k] - before.get(k, 0)
                  for k in ("forwards", "spec_drafted", "spec_accepted") if k in after}
        return {"decode_s": decode_s, "replies": replies, "tokens": tokens, **counts}


def measure(arm: Arm, workload: str, items: list, repeats: int) -> dict:
    """`items` (chat requests or session streams) run `repeats` times: one row of figures."""
    run = arm.answer if workload == "chat" else arm.watch
    runs = [run(items, greedy(MAX_TOKENS)) for _ in range(repeats)]
    replies = len(runs[0]["replies"])
    decoded = runs[0]["tokens"] - replies  # the tokens after each reply's first
    forwards = runs[0]["forwards"] - replies  # one prefill forward each
    row = {"arm": arm.name, "workload": workload, "replies": replies,
           "decoded_tokens": decoded, "decode_forwards": forwards,
           "acceptance_length": round(decoded / max(forwards, 1), 3),
           "decode_tokens_per_cpu_s": round(decoded / min(r["decode_s"] for r in runs), 1),
           "texts": runs[0]["replies"]}
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


def run(num_clips: int, num_streams: int, repeats: int) -> dict:
    model_dir, trained = world_paths()
    arms = [Arm("plain", model_dir, None),
            Arm("dflash-random", model_dir, random_drafter_like(trained)),
            Arm("dflash-world", model_dir, trained)]
    workloads = {"chat": world_questions(num_clips), "session": world_streams(num_streams)}
    for arm in arms:
        arm.answer(workloads["chat"][:5], greedy(MAX_TOKENS))  # warm-up
    summary = {"model": str(model_dir), "drafter": str(trained), "clips": num_clips,
               "streams": num_streams, "threads": torch.get_num_threads()}
    for workload, items in workloads.items():
        rows = {arm.name: measure(arm, workload, items, repeats) for arm in arms}
        texts = {name: row.pop("texts") for name, row in rows.items()}
        plain = rows["plain"]
        for name, row in rows.items():
            row["replies_identical_to_plain"] = texts[name] == texts["plain"]
            row["decode_speedup_vs_plain"] = round(
                row["decode_tokens_per_cpu_s"] / plain["decode_tokens_per_cpu_s"], 3)
            print(json.dumps(row), flush=True)
        assert all(r["replies_identical_to_plain"] for r in rows.values()), "a reply changed"
        summary.update({f"{workload}_{name}_{k}": rows[name][k]
                        for name in ("dflash-random", "dflash-world")
                        for k in ("acceptance_length", "decode_speedup_vs_plain")})
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clips", type=int, default=20, help="held-out clips (5 questions each)")
    parser.add_argument("--streams", type=int, default=5,
                        help="held-out live sessions (9 frames each)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(json.dumps(run(args.clips, args.streams, args.repeats)), flush=True)


if __name__ == "__main__":
    main()
