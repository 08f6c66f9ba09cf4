"""A colocated stage process (`stages.reasoner.colocate_with_generation`): the generation and
reasoner stage loops on one thread (`run_together`, the stage process's own loop), the reasoner
tied to the generator's weights as the stage process loads it.

With `colocation_yield: blocks` the generation forward pauses before each transformer block and
the reasoner runs there: a reply sent with a video job finishes inside the job's first denoising
step. With `steps` it waits for whole generation steps. Either way the video's frames and the
reply equal those of each job run alone (several seeds of one job: each seed's frames those of
its solo job), and the block hooks are gone when the loop ends."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from tests.support.seeds import SEEDS, assert_pairwise_different
from tests.unit.generation.test_cosmos3_engine import media
from worldserve.config import GenerationStageConfig, ReasonerStageConfig, ServerConfig
from worldserve.engines.generation.engine import GenerationEngine
from worldserve.engines.reasoner.engine import ReasonerEngine
from worldserve.ipc.capabilities import ReasonerSampling
from worldserve.ipc.messages import (
    ChatCompletion,
    ChatMessage,
    ChatPart,
    ChatResult,
    GenerationResult,
    Message,
)
from worldserve.levers import shared
from worldserve.runtime.colocation import Colocation, install
from worldserve.runtime.stage import StageLoop, run_together

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


class Mailbox:
    """A stage socket for one in-process loop: an inbox, and the replies sent back."""

    def __init__(self, on_reply: Any = None) -> None:
        self.inbox: list[Message] = []
        self.replies: list[Message] = []
        self.on_reply = on_reply

    def receive(self, timeout_ms: float) -> list[tuple[bytes, Message | None]]:
        items = [(b"test", msg) for msg in self.inbox]
        self.inbox.clear()
        return items

    def send(self, peer: bytes, msg: Message) -> None:
        self.replies.append(msg)
        if self.on_reply is not None:
            self.on_reply(msg)

    def close(self) -> None:
        pass


@pytest.fixture(scope="module")
def stages(tmp_path_factory: pytest.TempPathFactory) -> tuple[StageLoop, StageLoop]:
    """The generation loop (host) and the reasoner loop (guest), loaded like the colocated
    stage process loads them: generation first, the reasoner tied to its transformer."""
    from worldserve.models.cosmos3.dev import build_generation

    model = tmp_path_factory.mktemp("cosmos3-both")
    build_generation(model, 0)
    out = tmp_path_factory.mktemp("out")
    # a small explicit warm-up (the default one denoises a full-size frame: slow on a CPU)
    generation = GenerationEngine(GenerationStageConfig(
        model_path=model, output_dir=out, batch_wait_ms=0, warmup_resolutions=["48x32"]),
        ServerConfig())
    while generation.has_work():
        generation.step()
    try:
        reasoner = ReasonerEngine(ReasonerStageConfig(model_path=model), ServerConfig())
    finally:
        shared.withdraw(model, shared.GENERATOR_TRANSFORMER)
    embed = generation.pipe.transformer.embed_tokens.weight
    assert reasoner.runner.model.get_input_embeddings().weight is embed  # tied, as colocated
    return (StageLoop("generation", Mailbox(), generation),
            StageLoop("reasoner", Mailbox(), reasoner))


def chat() -> ChatCompletion:
    return ChatCompletion(
        request_id="chat", sampling=ReasonerSampling(max_tokens=16, temperature=0.8, seed=3),
        messages=[ChatMessage(role="user", parts=[ChatPart(type="text", text="Say hello.")])])


def capture_frames(engine: GenerationEngine) -> dict[tuple[str, int], np.ndarray]:
    """(request id, row) -> the frames the engine decoded for that row."""
    frames: dict[tuple[str, int], np.ndarray] = {}
    decode = type(engine.runner).decode

    def recording(state: Any, row: int) -> np.ndarray:
        out = decode(engine.runner, state, row)
        frames[state.row_owner[row], row] = out
        return out

    engine.runner.decode = recording
    return frames


def run_alone(loop: StageLoop, msg: Message) -> Message:
    loop.server.inbox.append(msg)
    loop.server.replies.clear()
    loop.beat(0)
    while loop.engine.has_work():
        loop.beat(0)
    return loop.server.replies[-1]


def block_hooks(engine: GenerationEngine) -> int:
    return sum(len(m._forward_pre_hooks) for m in engine.pipe.transformer.modules())


def run_colocated(host: StageLoop, guest: StageLoop, video: Message,
                  mode: str) -> tuple[ChatResult, int]:
    """`video` on the host and a chat on the guest in one colocated loop until both finish:
    the chat's reply, and how many of the job's denoising steps had run when it came."""
    gen: GenerationEngine = host.engine
    steps_at_reply: list[int] = []
    done: set[str] = set()

    def finished(name: str):
        def on_reply(msg: Message) -> None:
            if isinstance(msg, ChatResult):
                steps_at_reply.append(gen.denoise_steps)
            if isinstance(msg, (ChatResult, GenerationResult)):
                done.add(name)
            if done == {"generation", "reasoner"}:
                host.running = guest.running = False
        return on_reply

    host.server.on_reply, guest.server.on_reply = finished("generation"), finished("reasoner")
    host.server.inbox.append(video)
    guest.server.inbox.append(chat())
    steps_before = gen.denoise_steps
    try:
        run_together([host, guest], mode, max_yield_ms=60_000)
    finally:
        host.running = guest.running = True
        host.server.on_reply = guest.server.on_reply = None
    reply = guest.server.replies[-1]
    assert isinstance(reply, ChatResult)
    return reply, steps_at_reply[0] - steps_before


@pytest.mark.parametrize("mode", ["blocks", "steps"])
def test_colocated_results_equal_alone_and_blocks_mode_answers_inside_a_step(stages, mode):
    host, guest = stages
    gen: GenerationEngine = host.engine
    frames = capture_frames(gen)
    video = media("v", num_inference_steps=6)
    alone_result = run_alone(host, video)
    alone_frames = frames.pop(("v", 0))
    alone_reply = run_alone(guest, chat())
    assert isinstance(alone_result, GenerationResult) and isinstance(alone_reply, ChatResult)
    assert alone_reply.completion_tokens > 4

    hooks_before = block_hooks(gen)
    reply, steps_into_job = run_colocated(host, guest, video, mode)
    assert np.array_equal(frames["v", 0], alone_frames)
    assert (reply.text, reply.completion_tokens) == (alone_reply.text,
                                                     alone_reply.completion_tokens)
    if mode == "blocks":  # the whole reply ran inside the first denoising step's forward
        assert steps_into_job == 0
    else:  # one reasoner step per generation step: the reply outlasts the 6-step job
        assert steps_into_job == 6
    assert block_hooks(gen) == hooks_before  # the yield hooks are off again


@pytest.mark.parametrize("mode", ["blocks", "steps"])
def test_several_seeds_of_one_colocated_request_equal_each_seeds_solo_run(stages, mode):
    host, guest = stages
    frames = capture_frames(host.engine)
    for seed in SEEDS:
        solo = media(f"solo-{seed}", num_inference_steps=4, seeds=[seed])
        assert isinstance(run_alone(host, solo), GenerationResult)
    alone_reply = run_alone(guest, chat())
    reply, _ = run_colocated(host, guest, media("n", num_inference_steps=4, seeds=SEEDS), mode)
    rows = [frames["n", row] for row in range(len(SEEDS))]
    for seed, row in zip(SEEDS, rows, strict=True):
        assert np.array_equal(row, frames[f"solo-{seed}", 0]), seed
    assert_pairwise_different(rows)
    assert reply.text == alone_reply.text


def test_yield_hooks_sit_on_every_block_and_come_off(stages):
    host, _ = stages
    gen: GenerationEngine = host.engine
    before = block_hooks(gen)
    calls: list[int] = []
    num_blocks = gen.set_yield_point(lambda: calls.append(1))
    assert num_blocks == gen.pipe.transformer.config.num_hidden_layers
    assert block_hooks(gen) == before + num_blocks
    gen.set_yield_point(None)
    assert block_hooks(gen) == before


def test_blocks_mode_without_blocks_falls_back_to_steps(tmp_path: Path, stages):
    host, guest = stages

    class NoBlocks:
        def set_yield_point(self, point: Any) -> int:
            return 0

    loop = StageLoop.__new__(StageLoop)
    loop.stage, loop.engine = "generation", NoBlocks()
    assert install(loop, [guest], "blocks", 100.0) is None
    assert install(host, [guest], "steps", 100.0) is None


class FakeHostEngine:
    """Steps that reach `blocks` yield points each (a model stand-in)."""

    def __init__(self, steps: int, blocks: int) -> None:
        self.steps, self.blocks = steps, blocks
        self.point: Any = None
        self.yields_seen = 0

    def set_yield_point(self, point: Any) -> int:
        self.point = point
        return self.blocks if point is not None else 0

    def has_work(self) -> bool:
        return self.steps > 0

    def step(self) -> None:
        self.steps -= 1
        for _ in range(self.blocks):
            self.yields_seen += 1
            self.point()


class FakeLoop:
    def __init__(self, stage: str, engine: Any, beat: Any = None) -> None:
        self.stage, self.engine, self.running = stage, engine, True
        self._beat = beat

    def beat(self, idle_ms: float) -> bool:
        if self._beat is not None:
            return self._beat()
        busy = self.engine.has_work()
        if busy:
            self.engine.step()
        elif not any(loop.engine.has_work() for loop in LOOPS):
            for loop in LOOPS:
                loop.running = False
        return busy


LOOPS: list[FakeLoop] = []


def test_a_guest_error_inside_a_yield_surfaces_after_the_host_step():
    host_engine = FakeHostEngine(steps=3, blocks=4)
    turns: list[int] = []

    def failing_turn() -> bool:
        turns.append(host_engine.yields_seen)
        raise RuntimeError("reasoner broke")

    host = FakeLoop("generation", host_engine)
    guest = FakeLoop("reasoner", SimpleNamespace(has_work=lambda: True), beat=failing_turn)
    with pytest.raises(RuntimeError, match="reasoner broke"):
        run_together([host, guest], "blocks", 100.0)
    # raised at the first block's yield, kept until the host's step had run its 4 blocks
    assert turns == [1] and host_engine.yields_seen == 4 and host_engine.steps == 2
    assert host_engine.point is None  # the hooks came off


def test_yield_point_runs_guest_turns_while_the_guest_has_work():
    host_engine = FakeHostEngine(steps=1, blocks=3)
    work = [5]  # guest turns of work

    def guest_turn() -> bool:
        if work[0] == 0:
            return False
        work[0] -= 1
        return True

    host = FakeLoop("generation", host_engine)
    guest = FakeLoop("reasoner", SimpleNamespace(has_work=lambda: work[0] > 0), beat=guest_turn)
    LOOPS[:] = [host, guest]
    try:
        point = install(host, [guest], "blocks", 60_000.0)
        assert isinstance(point, Colocation)
        host_engine.step()
    finally:
        LOOPS.clear()
    assert work == [0]  # all 5 turns ran at the first block
    assert (point.num_yields, point.num_guest_turns) == (3, 5)


def test_compiled_blocks_still_reach_the_yield_hook_and_keep_the_frames():
    """`compile_repeated_blocks` (what another option turns on) compiles the hooked blocks: the
    hook is excluded from tracing, so it still runs at every block, and the frames stay those
    of the eager run (dynamo with the eager backend: inductor's kernels are its own matter)."""
    from worldserve.ipc.messages import GenerationParams
    from worldserve.models.cosmos3.dev import build_pipeline
    from worldserve.models.cosmos3.runner import Cosmos3Runner

    pipe = build_pipeline(0)
    runner = Cosmos3Runner(pipe)
    params = GenerationParams(prompt="a car", width=48, height=32, num_frames=5,
                              num_inference_steps=2, guidance_scale=4.0, seeds=[1], fps=24.0)
    eager = runner.run_to_end(params, 1)[0]
    pipe.transformer.compile_repeated_blocks(backend="eager", dynamic=True)
    calls: list[int] = []
    num_blocks = runner.set_yield_point(lambda: calls.append(1))
    try:
        compiled = runner.run_to_end(params, 1)[0]
    finally:
        runner.set_yield_point(None)
    # every block of cond + uncond in 2 steps, and once in the decode (2 latent frames)
    assert len(calls) == num_blocks * 2 * 2 + 1
    assert np.array_equal(compiled, eager)


def test_a_colocated_decode_yields_between_latent_frames_with_the_same_frames():
    from worldserve.ipc.messages import GenerationParams
    from worldserve.models.cosmos3.dev import build_pipeline
    from worldserve.models.cosmos3.runner import Cosmos3Runner

    runner = Cosmos3Runner(build_pipeline(0))
    params = GenerationParams(prompt="a car", width=48, height=32, num_frames=13,
                              num_inference_steps=1, guidance_scale=1.0, seeds=[1], fps=24.0)
    state = runner.prepare(["r"], [params], [1])
    runner.denoise_step(state)
    plain = runner.decode(state, 0)
    calls: list[int] = []
    runner.set_yield_point(lambda: calls.append(1))
    try:
        colocated = runner.decode(state, 0)
    finally:
        runner.set_yield_point(None)
    assert len(calls) == 3  # between the 4 latent frames of 13 frames
    assert np.array_equal(colocated, plain)
