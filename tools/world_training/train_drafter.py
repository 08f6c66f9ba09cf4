"""Train a DFlash drafter against the world reasoner (issue 30, item 2: "a DFlash drafter for
that reasoner, trained against it") and measure its acceptance on held-out clips.

The target is the reasoner of `<dev-models>/world/` as `worldserve dev-models build` builds it,
loaded by the serving loader. The drafter must predict what that target says, so its data are
the target's OWN greedy replies: every question of the grammar (colour, shape, direction,
background, caption) about training clips (seeds >= TRAIN_SEED_BASE), prompted the way a chat
request is (train_reasoner.WorldReasonerData), and its replies frame by frame in live sessions
over stream clips, spliced as the reasoner engine splices them; all decoded token by token
through the runner with its layers tapped, so each context is the hidden states serving feeds
the drafter (models/dflash/fit.py). The drafter is the dev drafter's architecture
(MuseGlimmerAssistantModel, models/dflash/dev.py) at the sizes below. The held-out figures are
the mean acceptance length (tokens per target decode step: accepted drafts + 1) of greedy
decoding replayed on clips with seeds 0..num_eval-1 (chat) and 0..num_eval/5-1 (sessions),
beside its ceiling (a drafter that is always right).

    python -m tools.world_training.train_drafter --out worldserve/models/dev/world/weights

writes `world_drafter.safetensors` and `world_drafter.json` (config, CPU minutes, acceptance);
`dev-models build` turns them into `<dev-models>/world-drafter/` (models/dflash/world.py).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from tools.world_training.train_reasoner import (
    CAPABILITIES,
    STREAM_SYSTEM_PROMPT,
    TRAIN_SEED_BASE,
    WorldReasonerData,
    _png,
)
from worldserve.models.dev.world.grammar import QUESTIONS
from worldserve.models.dev.world.scenes import make_clip
from worldserve.models.dflash import fit
from worldserve.models.dflash.dev import drafter_config, new_drafter
from worldserve.models.dflash.drafter import HiddenTap

MAX_NEW_TOKENS = 16


@dataclass(frozen=True)
class DrafterTrainConfig:
    block_size: int = 8  # the anchor + 7 masks: a caption (8 tokens) in one or two steps
    num_layers: int = 2
    target_layer_ids: tuple[int, ...] = (0, 1, 2, 3)  # every layer of the 4-layer reasoner
    train_clips: int = 600
    train_sessions: int = 100  # stream clips of 9 frames: 9 replies each
    num_eval: int = 50  # held-out clips, and live sessions: num_eval // 5
    steps: int = 800
    batch_size: int = 256
    learning_rate: float = 3e-3
    seed: int = 0


@dataclass
class Replies:
    """The target's greedy replies and what the drafter sees of them."""

    ids: list[list[int]]  # prompt + reply (closed by the end of turn when reached)
    first_anchors: list[int]  # the index of each reply's first token
    hidden: list[torch.Tensor]  # (N, L*H) tapped hidden states of every token but the last
    positions: list[torch.Tensor]  # (N,)

    def ceiling(self, block_size: int) -> float:
        """The acceptance length of a drafter that is always right: each decode step then
        makes `block_size` tokens, or what is left of the reply."""
        decoded = [len(ids) - 1 - anchor for ids, anchor in zip(self.ids, self.first_anchors)]
        return sum(decoded) / max(sum(-(-n // block_size) for n in decoded), 1)

    def examples(self, block_size: int) -> list[fit.DraftExample]:
        return [ex for ids, anchor, hidden, positions in zip(
            self.ids, self.first_anchors, self.hidden, self.positions)
            for ex in fit.examples_of(hidden, positions, ids, anchor, block_size)]


@torch.no_grad()
def greedy_replies(data: WorldReasonerData, seeds: range, layer_ids: list[int]) -> Replies:
    """Each grammar question about each clip, decoded greedily by the runner (prefill, then
    one token per forward, as plain serving decodes), with `layer_ids` tapped."""
    decoder = _Decoder(data, layer_ids)
    out = Replies([], [], [], [])
    for seed in seeds:
        media = data.read_clip(make_clip(seed, "motion"))
        for capability in CAPABILITIES:
            prompt = data.example(media, QUESTIONS[capability][0], None).ids
            kv = data.runner.new_kv()
            decoder.reset()
            decoder.reply(kv, prompt, [media])
            decoder.add_to(out, kv, len(prompt))
    decoder.tap.remove()
    return out


@torch.no_grad()
def session_replies(data: WorldReasonerData, seeds: range, layer_ids: list[int]) -> Replies:
    """Live sessions over stream clips ("what colour is it now?" after every frame), spliced
    turn by turn as the reasoner engine splices them (PromptBuilder.frame_chunk) and decoded
    greedily: one entry per reply, its context the session so far."""
    decoder = _Decoder(data, layer_ids)
    builder = data.prompt_builder
    out = Replies([], [], [], [])
    for seed in seeds:
        kv, last = data.runner.new_kv(), None
        decoder.reset()
        for index, frame in enumerate(make_clip(seed, "stream").frames):
            chunk = builder.frame_chunk(_png(frame), STREAM_SYSTEM_PROMPT if index == 0 else None,
                                        QUESTIONS["colour_now"][0], last, {data.end_of_turn})
            anchor = len(decoder.ids) + len(chunk.closing_ids) + len(chunk.turn_ids)
            last = decoder.reply(kv, chunk.closing_ids + chunk.turn_ids, [chunk.image])
            decoder.add_to(out, kv, anchor)
    decoder.tap.remove()
    return out


class _Decoder:
    """Greedy decoding through the runner with the drafter's layers tapped: the sequence fed
    so far (`ids`, plus the last sampled token) and the taps of every fed token."""

    def __init__(self, data: WorldReasonerData, layer_ids: list[int]) -> None:
        self.runner, self.end = data.runner, data.end_of_turn
        self.layer_ids = layer_ids
        self.tap = HiddenTap(data.runner.model, layer_ids)
        self.reset()

    def reset(self) -> None:
        self.ids: list[int] = []
        self.taps: list[torch.Tensor] = []
        self.pending = -1

    def reply(self, kv: Any, fed: list[int], media: list[Any] | None) -> int:
        """Feed `fed` (with its media), then decode to the end of turn or MAX_NEW_TOKENS; the
        last sampled token (not fed: serving feeds it with what comes next)."""
        for _ in range(MAX_NEW_TOKENS):
            with self.tap.capture() as seen:
                logits = self.runner.forward(kv, fed, media)
            self.ids += fed
            self.taps.append(torch.cat([seen[i][0] for i in self.layer_ids], dim=-1).float())
            token, media = int(logits[-1].argmax()), None
            if token == self.end:
                break
            fed = [token]
        self.pending = token
        return token

    def add_to(self, out: Replies, kv: Any, first_anchor: int) -> None:
        out.ids.append(self.ids + [self.pending])
        out.first_anchors.append(first_anchor)
        out.hidden.append(torch.cat(self.taps))
        out.positions.append(kv.positions[0].clone())


def acceptance(drafter: Any, target: Any, replies: Replies) -> float:
    return fit.acceptance_length(drafter, target, replies.hidden, replies.positions,
                                 replies.ids, replies.first_anchors)


def train(runner: Any, cfg: DrafterTrainConfig, log: Any = print) -> tuple[Any, dict[str, Any]]:
    """A drafter trained on the target's replies; returns it and the manifest's figures."""
    start = time.process_time()
    text = runner.model.config.get_text_config()
    config = drafter_config(text.hidden_size, text.num_hidden_layers, text.vocab_size,
                            cfg.block_size, cfg.num_layers, list(cfg.target_layer_ids))
    drafter = new_drafter(config, cfg.seed)
    layer_ids = list(config.target_layer_ids)
    data = WorldReasonerData(runner)
    base = TRAIN_SEED_BASE + cfg.seed * cfg.train_clips
    train_sets = [greedy_replies(data, range(base, base + cfg.train_clips), layer_ids),
                  session_replies(data, range(base, base + cfg.train_sessions), layer_ids)]
    held_out = {"chat": greedy_replies(data, range(cfg.num_eval), layer_ids),
                "session": session_replies(data, range(cfg.num_eval // 5), layer_ids)}
    examples = [ex for replies in train_sets for ex in replies.examples(cfg.block_size)]
    log({"examples": len(examples), "data_cpu_s": round(time.process_time() - start, 1),
         "held_out_acceptance_before": {k: round(acceptance(drafter, runner.model, v), 3)
                                        for k, v in held_out.items()}})
    fit_start = time.process_time()
    loss = fit.fit(drafter, runner.model, examples, steps=cfg.steps, lr=cfg.learning_rate,
                   seed=cfg.seed, batch_size=cfg.batch_size)
    figures = {
        "config": asdict(cfg), "train_examples": len(examples), "last_loss": round(loss, 4),
        "fit_cpu_s": round(time.process_time() - fit_start, 1),
        "held_out_acceptance_length": {k: round(acceptance(drafter, runner.model, v), 3)
                                       for k, v in held_out.items()},
        "held_out_ceiling": {k: round(v.ceiling(cfg.block_size), 3)
                             for k, v in held_out.items()},
        "train_acceptance_length": [round(acceptance(drafter, runner.model, v), 3)
                                    for v in train_sets],
        "cpu_minutes": round((time.process_time() - start) / 60, 2),
    }
    log(figures)
    return drafter, figures


def main(argv: list[str] | None = None) -> None:
    from worldserve import envs
    from worldserve.models.cosmos3_reasoner.loader import load_runner
    from worldserve.models.dflash import world

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", type=Path, default=None,
                        help="the world directory (default: <dev-models>/world, built by "
                             "`worldserve dev-models build`)")
    parser.add_argument("--steps", type=int, default=DrafterTrainConfig.steps)
    parser.add_argument("--block-size", type=int, default=DrafterTrainConfig.block_size)
    parser.add_argument("--num-layers", type=int, default=DrafterTrainConfig.num_layers)
    parser.add_argument("--train-clips", type=int, default=DrafterTrainConfig.train_clips)
    parser.add_argument("--train-sessions", type=int,
                        default=DrafterTrainConfig.train_sessions)
    parser.add_argument("--num-eval", type=int, default=DrafterTrainConfig.num_eval)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None,
                        help="write world_drafter.safetensors and .json into this directory")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    runner = load_runner(args.model_dir or envs.dev_models_dir() / "world")
    cfg = DrafterTrainConfig(steps=args.steps, block_size=args.block_size,
                             num_layers=args.num_layers, train_clips=args.train_clips,
                             train_sessions=args.train_sessions, num_eval=args.num_eval)
    drafter, figures = train(runner, cfg, lambda entry: print(json.dumps(entry), flush=True))
    if args.out is not None:
        world.save(drafter, args.out, {**figures, "threads": args.threads})


if __name__ == "__main__":
    main()
