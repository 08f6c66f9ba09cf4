"""vLLM-Omni's `/v1/realtime/video` against the real causal backend with the dev checkpoint.

The same session through both protocols must produce the same world: the vLLM-Omni socket's
fMP4 chunks are byte for byte the fMP4 encoding of the SGLang socket's raw frames for the same
prompt, seed and camera script (the first chunk's latent frames expand to 1 + 4 + 4 frames).
"""

from __future__ import annotations

from tests.integration.realtime.helpers import Session, connect
from tests.integration.realtime.omni_client import OmniSession, decode_chunk
from tests.integration.realtime.omni_client import connect as omni_connect
from worldserve.media.fmp4 import FragmentedMP4Writer

CAUSAL_CONFIG = {"stages": {"generation": {"enabled": False}, "reasoner": {"enabled": False},
                            "realtime": {"enabled": True, "backend": "causal"}}}
SCRIPT = [[["d"], ["d"], []], [["w"], ["w"], ["j"]], [[], ["a"], ["a"]]]  # per latent frame
# The same script per output frame: the first block decodes 1 + 4 + 4 frames, the others 4 each.
FRAMES = ([["d"]] * 5 + [[]] * 4 + [["w"]] * 8 + [["j"]] * 4 + [[]] * 4 + [["a"]] * 8)


async def test_both_protocols_generate_the_same_world(server_factory):
    server = server_factory(CAUSAL_CONFIG)
    async with omni_connect(server) as ws:
        omni = OmniSession(ws)
        await omni.send({"type": "session.start", "prompt": "a castle", "seed": 9,
                         "num_frames": 33, "extra_params": {"camera_action_script": SCRIPT}})
        start = await omni.next_message(timeout_s=60)
        done = await omni.until("session.done", timeout_s=120)
    assert start["type"] == "video.start" and done["chunks"] == 3
    async with connect(server) as ws:
        sglang = Session(ws)
        await sglang.send({"type": "init", "prompt": "a castle", "seed": 9, "max_chunks": 3,
                           "condition_inputs": {"camera_actions": FRAMES}})
        chunks, code, _ = await sglang.read_until_close(timeout_s=120)
    assert code == 1000 and [len(c.frames) for c in chunks] == [9, 12, 12]
    assert [c.metadata["num_frames"] for c in omni.chunks] == [9, 12, 12]
    config = start["config"]
    writer = FragmentedMP4Writer(config["width"], config["height"], config["fps"])
    for index, chunk in enumerate(chunks):
        assert omni.chunks[index].data == writer.write(chunk.frames), f"chunk {index} differs"
        decoded = decode_chunk(omni.chunks, index)
        assert (decoded.width, decoded.height) == (config["width"], config["height"])
        assert decoded.frames.shape == chunk.frames.shape
    writer.close()
