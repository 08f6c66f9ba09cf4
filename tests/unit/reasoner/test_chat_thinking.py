"""Chat completions with reasoning blocks, thinking budgets, clamped max_tokens and video clips
on the real engine (tiny Cosmos3 Omni). References are the engine's own unconstrained greedy
replies: a budget must only cut the block, never change the tokens before the cut."""

from __future__ import annotations

import pytest

from tests.support.images import random_png
from tests.unit.reasoner.conftest import GREEDY, Driver
from worldserve.config import ReasonerStageConfig, ServerConfig
from worldserve.engines.reasoner import admission
from worldserve.engines.reasoner.engine import ReasonerEngine
from worldserve.engines.reasoner.thinking import THINK_END, split_reasoning
from worldserve.errors import InvalidRequest
from worldserve.ipc.messages import (
    ChatCompletion,
    ChatDelta,
    ChatMessage,
    ChatPart,
    ChatResult,
    ReasonerSampling,
)

# A template that opens the reasoning block itself with enable_thinking (as DeepSeek-R1-style
# and Qwen3 "thinking" templates do): the reply starts inside it.
THINKING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}"
    "{% for c in m['content'] %}"
    "{% if c['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif c['type'] == 'video' %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking %}<think>\n{% endif %}{% endif %}"
)


@pytest.fixture(scope="module")
def drv(tmp_path_factory: pytest.TempPathFactory) -> Driver:
    from worldserve.models.cosmos3_reasoner.dev import write_reasoner_files

    target = tmp_path_factory.mktemp("thinking")
    write_reasoner_files(target, 0, "cosmos3_omni", max_position_embeddings=4096)
    (target / "chat_template.jinja").write_text(THINKING_TEMPLATE, encoding="utf-8")
    stage = ReasonerStageConfig(model_path=target, max_model_len=1200)
    return Driver(ReasonerEngine(stage, ServerConfig()))


def chat(drv: Driver, max_tokens: int, parts: list[ChatPart] | None = None,
         stream: bool = False, **extra) -> tuple[ChatResult, list]:
    start = len(drv.replies)
    sampling = ReasonerSampling(max_tokens=max_tokens, **GREEDY,
                                **extra.pop("sampling", {}))
    request = ChatCompletion(
        request_id=drv._id("chat"), sampling=sampling, stream=stream,
        messages=[ChatMessage(role="user", parts=parts or [
            ChatPart(type="text", text="Describe the scene in detail.")])], **extra)
    result = drv.call(request)
    assert isinstance(result, ChatResult)
    return result, drv.replies[start:-1]


def test_split_reasoning_rules() -> None:
    assert split_reasoning("plain answer", False) == (None, "plain answer")
    assert split_reasoning("<think>a b</think>\n\nok", False) == ("a b", "\n\nok")
    assert split_reasoning("x <think>a</think>y", False) == (None, "x <think>a</think>y")
    assert split_reasoning("a b</think>ok", True) == ("a b", "ok")
    assert split_reasoning("cut before the end", True) == ("cut before the end", "")


def test_budget_closes_the_block_after_exactly_the_budget(drv: Driver) -> None:
    budget = 12
    free, _ = chat(drv, budget, template_kwargs={"enable_thinking": True})
    assert free.text == "" and free.reasoning  # a cut block is all reasoning
    close = drv.engine.runner.tokenizer.encode(THINK_END, add_special_tokens=False)
    capped, _ = chat(drv, budget + len(close) + 8, template_kwargs={"enable_thinking": True},
                     thinking_token_budget=budget)
    assert capped.reasoning == free.reasoning  # the same tokens up to the budget
    assert capped.completion_tokens >= budget + len(close)


def test_grammar_applies_after_the_block_only(drv: Driver) -> None:
    budget = 10
    free, _ = chat(drv, budget, template_kwargs={"enable_thinking": True})
    done, _ = chat(drv, 60, template_kwargs={"enable_thinking": True},
                   thinking_token_budget=budget, sampling={"guided_choice": ["yes", "no"]})
    assert done.reasoning == free.reasoning  # unconstrained inside the block
    assert done.text in ("yes", "no") and done.finish_reason == "stop"


def test_stream_deltas_add_up_to_the_reply(drv: Driver) -> None:
    kwargs = dict(template_kwargs={"enable_thinking": True}, thinking_token_budget=8)
    whole, _ = chat(drv, 30, **kwargs)
    streamed, deltas = chat(drv, 30, stream=True, **kwargs)
    assert all(isinstance(d, ChatDelta) for d in deltas)
    assert "".join(d.reasoning for d in deltas) == whole.reasoning == streamed.reasoning
    assert "".join(d.text for d in deltas) == whole.text == streamed.text


def test_without_thinking_the_reply_is_all_content(drv: Driver) -> None:
    reply, _ = chat(drv, 16)
    assert reply.reasoning is None and reply.completion_tokens <= 16


def test_max_tokens_beyond_the_context_is_lowered_to_the_room_left(drv: Driver) -> None:
    request = ChatCompletion(request_id="r", sampling=ReasonerSampling(max_tokens=10**9),
                             messages=[ChatMessage(role="user", parts=[
                                 ChatPart(type="text", text="x")])])
    fitted = admission.fit_max_tokens(request, prompt_tokens=30, max_model_len=1200)
    assert fitted.sampling.max_tokens == 1170
    assert admission.fit_max_tokens(fitted, 30, 4000) is fitted  # within the room: unchanged
    with pytest.raises(InvalidRequest, match=r"Input length \(1200\) exceeds"):
        admission.fit_max_tokens(request, prompt_tokens=1200, max_model_len=1200)
    reply, _ = chat(drv, 10**9, sampling={"stop": ["e"]})  # accepted, not a 400
    assert reply.finish_reason in ("stop", "length")


def test_a_video_part_prefills_its_clip(drv: Driver) -> None:
    frames = [random_png(64, 48, seed) for seed in range(3)]
    clip = drv.engine.prompts.prompting.read_video(frames, 2.0)
    text_only, _ = chat(drv, 1, parts=[ChatPart(type="text", text="What happens?")])
    with_clip, _ = chat(drv, 1, parts=[ChatPart(type="video", frames=frames, fps=2.0),
                                       ChatPart(type="text", text="What happens?")])
    wrapper = len(drv.engine.runner.tokenizer.encode(
        "<|vision_start|><|video_pad|><|vision_end|>", add_special_tokens=False))
    # the clip's placeholder expands to the clip's tokens (timestamps included for Omni)
    assert with_clip.prompt_tokens - text_only.prompt_tokens >= clip.num_tokens + wrapper - 1
