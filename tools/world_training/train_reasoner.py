"""Train the dev Cosmos3 reasoner on the dev world and measure its exact answers (issue 30,
item 2, the reasoner part). A measurement: nothing here replaces the shipped dev models.

The model is the dev generation directory's reasoner (`Cosmos3OmniForConditionalGeneration`,
built by `worldserve dev-models build`), loaded by the serving loader, and its prompts are the
serving path's own: the chat template renders a user turn of one video part and the question,
and `QwenVLPrompting` reads the clip's PNG frames and expands the placeholders exactly as a chat
request's would be (the server's clip sampling is not involved: all frames are sent at the
world's fps). The loss is cross-entropy on the answer tokens and the end of turn.

    python -m tools.world_training.train_reasoner --steps 1500 --out /tmp/world-reasoner
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from worldserve.models.dev.world.evaluate import answer_matches
from worldserve.models.dev.world.grammar import QUESTIONS, answer
from worldserve.models.dev.world.render import png_bytes
from worldserve.models.dev.world.scenes import WorldClip, make_clip

CAPABILITIES = ("colour", "shape", "direction", "background", "caption")
# Held-out evaluation clips use seeds below this; training clips seeds from it upwards.
TRAIN_SEED_BASE = 1_000_000
IGNORE = -100


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 1500
    batch_size: int = 32
    learning_rate: float = 3e-3
    weight_decay: float = 0.01
    pool_clips: int = 3000  # training clips drawn once (preprocessing dominates a step)
    num_eval: int = 200  # held-out clips per capability
    eval_every: int = 250
    seed: int = 0


@dataclass(frozen=True)
class Example:
    ids: list[int]
    num_prompt: int  # the first num_prompt ids are the prompt (no loss)
    media: Any  # the clip's VisionInput, or a list of one per frame (a stream session)
    # (start, end) spans of ids that carry the loss; None: everything after num_prompt
    answer_spans: tuple[tuple[int, int], ...] | None = None

    @property
    def media_list(self) -> list[Any]:
        return self.media if isinstance(self.media, list) else [self.media]


# A live session's instructions while training (any system prompt works at serving time; this
# one is what the benchmark and the tests send).
STREAM_SYSTEM_PROMPT = "Answer in one word."


class WorldReasonerData:
    """Prompts and answers about world clips, tokenised the way the serving path does."""

    def __init__(self, runner: Any) -> None:
        self.runner = runner
        self.end_of_turn = runner.tokenizer.convert_tokens_to_ids("<|im_end|>")

    @functools.cached_property
    def prompt_builder(self) -> Any:
        from worldserve.engines.reasoner.prompt import PromptBuilder

        return PromptBuilder(self.runner.tokenizer, self.runner.chat_template,
                             self.runner.prompting)

    def read_clip(self, clip: WorldClip) -> Any:
        frames = [png_bytes(frame) for frame in clip.frames]
        return self.runner.prompting.read_video(frames, clip.fps)

    def stream_example(self, clip: WorldClip, num_frames: int) -> Example:
        """A live reasoning session over the clip's first `num_frames` frames, token for token
        as the reasoner engine splices it (engines/reasoner/prompt.py `frame_chunk`): the
        first frame's turn carries the system prompt and the question, each later turn one
        frame; every reply is the colour shown in its frame, closed by the end-of-turn ids."""
        builder = self.prompt_builder
        ids: list[int] = []
        media, spans = [], []
        question = QUESTIONS["colour_now"][0]
        for index in range(num_frames):
            chunk = builder.frame_chunk(png_bytes(clip.frames[index]),
                                        STREAM_SYSTEM_PROMPT if index == 0 else None,
                                        question, None, set())
            ids += chunk.closing_ids + chunk.turn_ids
            reply = list(self.runner.tokenizer(clip.colour_per_frame[index],
                                               add_special_tokens=False)["input_ids"])
            spans.append((len(ids), len(ids) + len(reply) + 1))  # the reply and its end
            ids += reply
            media.append(chunk.image)
        ids += builder.end_of_turn_ids
        return Example(ids, spans[0][0], media, tuple(spans))

    def example(self, media: Any, question: str, reply: str | None) -> Example:
        messages = [{"role": "user", "content": [{"type": "video"},
                                                 {"type": "text", "text": question}]}]
        text = self.runner.tokenizer.apply_chat_template(
            messages, chat_template=self.runner.chat_template, tokenize=False,
            add_generation_prompt=True)
        prompt = self.runner.prompting.tokenize(text, [media])
        if reply is None:
            return Example(prompt, len(prompt), media)
        reply_ids = list(self.runner.tokenizer(reply, add_special_tokens=False)["input_ids"])
        return Example(prompt + reply_ids + [self.end_of_turn], len(prompt), media)


def model_inputs(runner: Any, examples: list[Example], with_labels: bool) -> dict[str, Any]:
    """One right-padded batch: ids, mask, labels (answer tokens only) and the clips' pixels."""
    length = max(len(e.ids) for e in examples)
    pad = runner.tokenizer.pad_token_id
    ids = torch.full((len(examples), length), pad, dtype=torch.long)
    mask = torch.zeros((len(examples), length), dtype=torch.long)
    labels = torch.full((len(examples), length), IGNORE, dtype=torch.long)
    for row, example in enumerate(examples):
        ids[row, :len(example.ids)] = torch.tensor(example.ids)
        mask[row, :len(example.ids)] = 1
        for start, end in example.answer_spans or ((example.num_prompt, len(example.ids)),):
            labels[row, start:end] = ids[row, start:end]
    inputs = {"input_ids": ids, "attention_mask": mask,
              "mm_token_type_ids": runner.prompting.token_types(ids)}
    media = [m for e in examples for m in e.media_list]
    for kind in ("image", "video"):
        parts = [m.payload for m in media if m.kind == kind]
        if parts:
            inputs[f"pixel_values{'_videos' if kind == 'video' else ''}"] = torch.cat(
                [p.pixel_values for p in parts])
            inputs[f"{kind}_grid_thw"] = torch.cat([p.grid_thw for p in parts])
    if with_labels:
        inputs["labels"] = labels
    return inputs


def build_pool(data: WorldReasonerData, cfg: TrainConfig) -> list[Example]:
    """`pool_clips` training clips, each with every capability's question and answer."""
    pool = []
    for index in range(cfg.pool_clips):
        clip = make_clip(TRAIN_SEED_BASE + cfg.seed * cfg.pool_clips + index, "motion")
        media = data.read_clip(clip)
        pool += [data.example(media, QUESTIONS[c][0], answer(clip, c)) for c in CAPABILITIES]
    return pool


@torch.no_grad()
def exact_accuracy(data: WorldReasonerData, num_eval: int, max_new_tokens: int = 16
                   ) -> dict[str, float]:
    """capability -> exact-match rate of greedy replies on held-out clips (seeds 0..num_eval-1)."""
    model = data.runner.model.eval()
    clips = [make_clip(seed, "motion") for seed in range(num_eval)]
    media = [data.read_clip(clip) for clip in clips]
    scores = {}
    for capability in CAPABILITIES:
        hits = []
        for start in range(0, num_eval, 50):
            batch = [data.example(m, QUESTIONS[capability][0], None)
                     for m in media[start:start + 50]]
            out = model.generate(**model_inputs(data.runner, batch, with_labels=False),
                                 max_new_tokens=max_new_tokens, do_sample=False)
            replies = data.runner.tokenizer.batch_decode(out[:, len(batch[0].ids):],
                                                         skip_special_tokens=True)
            hits += [answer_matches(reply, answer(clip, capability))
                     for reply, clip in zip(replies, clips[start:start + 50], strict=True)]
        scores[capability] = sum(hits) / len(hits)
    model.train()
    return scores


def train(runner: Any, cfg: TrainConfig, log: Any = print) -> dict[str, Any]:
    """Train in place; returns the log of evaluations (steps, CPU seconds, accuracies)."""
    torch.manual_seed(cfg.seed)
    data = WorldReasonerData(runner)
    start = time.process_time()
    pool = build_pool(data, cfg)
    log({"pool_examples": len(pool), "pool_cpu_s": round(time.process_time() - start, 1)})
    model = runner.model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimiser = torch.optim.AdamW(params, lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimiser, lambda s: lr_factor(s, cfg.steps))
    rng = np.random.default_rng(cfg.seed)
    history, train_start = [], time.process_time()
    for step in range(1, cfg.steps + 1):
        batch = [pool[int(i)] for i in rng.integers(len(pool), size=cfg.batch_size)]
        loss = model(**model_inputs(runner, batch, with_labels=True)).loss
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimiser.step()
        schedule.step()
        if step % cfg.eval_every == 0 or step == cfg.steps:
            entry = {"step": step, "loss": round(float(loss.detach()), 4),
                     "train_cpu_s": round(time.process_time() - train_start, 1),
                     "accuracy": exact_accuracy(data, cfg.num_eval)}
            history.append(entry)
            log(entry)
    return {"config": asdict(cfg), "history": history}


def set_min_pixels(runner: Any, min_pixels: int) -> None:
    """Upscale small frames to at least `min_pixels` before patching: the dev reasoner's 16 px
    patches merged 2x2 leave a 64x64 frame 2x2 tokens per temporal group; 128x128 gives 4x4."""
    processor = runner.prompting.image_processor
    processor.size = {"shortest_edge": min_pixels, "longest_edge": processor.size.longest_edge}


def load_dev_reasoner(model_dir: Path | None) -> Any:
    """The dev generation directory's reasoner runner (built into a temporary directory when
    `model_dir` is None)."""
    from worldserve.models.cosmos3.dev import build_generation
    from worldserve.models.cosmos3_reasoner.loader import load_runner

    if model_dir is None:
        model_dir = Path(tempfile.mkdtemp(prefix="world-reasoner-"))
        build_generation(model_dir, 0)
    return load_runner(model_dir)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", type=Path, default=None,
                        help="a dev generation directory (default: build one in a temp dir)")
    parser.add_argument("--steps", type=int, default=TrainConfig.steps)
    parser.add_argument("--batch-size", type=int, default=TrainConfig.batch_size)
    parser.add_argument("--lr", type=float, default=TrainConfig.learning_rate)
    parser.add_argument("--pool-clips", type=int, default=TrainConfig.pool_clips)
    parser.add_argument("--eval-every", type=int, default=TrainConfig.eval_every)
    parser.add_argument("--num-eval", type=int, default=TrainConfig.num_eval)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--min-pixels", type=int, default=None,
                        help="upscale frames to at least this many pixels (e.g. 16384)")
    parser.add_argument("--out", type=Path, default=None, help="save the trained reasoner here")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    runner = load_dev_reasoner(args.model_dir)
    if args.min_pixels:
        set_min_pixels(runner, args.min_pixels)
    log = lambda entry: print(json.dumps(entry), flush=True)  # noqa: E731
    log({"params": sum(p.numel() for p in runner.model.parameters()),
         "before": exact_accuracy(WorldReasonerData(runner), args.num_eval)})
    cfg = TrainConfig(steps=args.steps, batch_size=args.batch_size, learning_rate=args.lr,
                      pool_clips=args.pool_clips, num_eval=args.num_eval,
                      eval_every=args.eval_every)
    train(runner, cfg, log)
    if args.out is not None:
        runner.model.save_pretrained(args.out)
        runner.prompting.image_processor.save_pretrained(args.out)


def lr_factor(step: int, num_steps: int) -> float:
    """Linear warm-up over the first 5 % of the steps, then a cosine decay to zero."""
    warmup = max(1, num_steps // 20)
    return min(1.0, (step + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * step / num_steps))


if __name__ == "__main__":
    main()
