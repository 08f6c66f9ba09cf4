"""The dev world's reasoner training feeds the model what the serving path would: the same
prompt ids as the reasoner engine's chat prompt, and a loss on the answer only."""

from __future__ import annotations

import pytest
import torch

from tools.world_training.train_reasoner import (
    IGNORE,
    STREAM_SYSTEM_PROMPT,
    WorldReasonerData,
    model_inputs,
)
from worldserve.models.dev.world.grammar import QUESTIONS
from worldserve.models.dev.world.render import png_bytes
from worldserve.models.dev.world.scenes import make_clip

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def runner(tmp_path_factory):
    from worldserve.models.cosmos3.dev import build_generation
    from worldserve.models.cosmos3_reasoner.loader import load_runner

    model_dir = tmp_path_factory.mktemp("generation")
    build_generation(model_dir, 0)
    return load_runner(model_dir)


def test_prompts_are_the_reasoner_engines_chat_prompts(runner):
    from worldserve.engines.reasoner.prompt import PromptBuilder

    data = WorldReasonerData(runner)
    media = data.read_clip(make_clip(0, "motion"))
    question = QUESTIONS["direction"][0]
    example = data.example(media, question, "left")
    messages = [{"role": "user", "content": [{"type": "video"},
                                             {"type": "text", "text": question}]}]
    served = PromptBuilder(runner.tokenizer, runner.chat_template, runner.prompting).chat_prompt(
        messages, [media])
    assert example.ids[:example.num_prompt] == served.input_ids
    assert example.ids[-1] == runner.tokenizer.convert_tokens_to_ids("<|im_end|>")


def test_the_loss_covers_the_answer_only(runner):
    data = WorldReasonerData(runner)
    clips = [make_clip(seed, "motion") for seed in range(2)]
    examples = [data.example(data.read_clip(clips[0]), QUESTIONS["colour"][0], "red"),
                data.example(data.read_clip(clips[1]), QUESTIONS["caption"][0],
                             "a red circle on black moving left")]
    inputs = model_inputs(runner, examples, with_labels=True)
    for row, example in enumerate(examples):
        labels = inputs["labels"][row]
        assert (labels[:example.num_prompt] == IGNORE).all()
        assert labels[example.num_prompt:len(example.ids)].tolist() == example.ids[
            example.num_prompt:]
        assert (labels[len(example.ids):] == IGNORE).all()
        assert inputs["attention_mask"][row].sum() == len(example.ids)
    loss = runner.model(**inputs).loss
    assert torch.isfinite(loss) and loss > 0


def test_a_live_session_example_is_the_engines_session_with_each_frames_colour(runner):
    """Turn for turn what the reasoner engine splices for a session (first turn: system prompt,
    frame and question; later turns: one frame, each after the previous reply's end), and the
    loss falls on every reply and its end-of-turn token, nothing else."""
    from worldserve.engines.reasoner.prompt import PromptBuilder

    clip = make_clip(3, "stream")
    assert len(set(clip.colour_per_frame)) > 1  # the colour changes within the clip
    data = WorldReasonerData(runner)
    example = data.stream_example(clip, 6)
    builder = PromptBuilder(runner.tokenizer, runner.chat_template, runner.prompting)
    first = builder.frame_chunk(png_bytes(clip.frames[0]), STREAM_SYSTEM_PROMPT,
                                QUESTIONS["colour_now"][0], None, set())
    assert example.ids[:len(first.turn_ids)] == first.turn_ids
    assert len(example.answer_spans) == len(example.media) == 6
    inputs = model_inputs(runner, [example], with_labels=True)
    labels = inputs["labels"][0]
    end = runner.tokenizer.convert_tokens_to_ids("<|im_end|>")
    for (start, stop), colour in zip(example.answer_spans, clip.colour_per_frame):
        assert runner.tokenizer.decode(example.ids[start:stop - 1]) == colour
        assert example.ids[stop - 1] == end
    covered = sum(stop - start for start, stop in example.answer_spans)
    assert int((labels != IGNORE).sum()) == covered
    assert inputs["image_grid_thw"].shape[0] == 6 and "pixel_values_videos" not in inputs
    assert torch.isfinite(runner.model(**inputs).loss)
