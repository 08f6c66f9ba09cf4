"""Planted bugs, one per claimed equivalence, and the tests that claim to catch each.

A plant replaces `anchor` (exact text, found exactly once in `path`) with `replacement` in a
temporary copy of the project; every test in `caught_by` must then fail there (`run.py`). When a
refactor moves the code, the anchor is missing and the check fails naming the plant: give it a
new anchor in this table, never drop it silently. Add a plant by adding one entry.

`caught_by` entries are pytest node ids relative to the repository root: `file::test` (every
parametrisation of the test) or a whole file.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Plant:
    """One planted bug: what it breaks (`claim`), where, and which tests must fail."""

    name: str
    claim: str
    path: str
    anchor: str
    replacement: str
    caught_by: tuple[str, ...]


SHARED_WEIGHTS = ("tests/unit/reasoner/test_cosmos3_shared_weights.py"
                  "::test_reasoner_llm_tensors_equal_transformers_own_renaming")
COSMOS3_INTERLEAVED = ("tests/unit/models/test_cosmos3.py"
                       "::test_interleaved_requests_equal_their_solo_runs")
COSMOS3_ENGINE_INTERLEAVED = ("tests/unit/generation/test_cosmos3_engine.py"
                              "::test_interleaved_requests_equal_their_solo_runs_and_sound_is_written")
COSMOS3_SOUND = "tests/unit/models/test_cosmos3.py::test_text_to_video_with_sound_equals_pipeline"
DFLASH_SAMPLED = "tests/unit/reasoner/test_dflash.py::test_seeded_sampling_is_lossless"
NGRAM_LOSSLESS = "tests/unit/reasoner/test_decoding.py::test_ngram_speculation_is_lossless"
SEEDED = ("tests/unit/reasoner/test_decoding.py"
          "::test_seeded_sampling_is_reproducible_and_seed_dependent")
SAMPLING = "tests/unit/reasoner/test_sampling.py"
REALTIME_STEERS = ("tests/unit/world/test_realtime_world.py"
                   "::test_a_held_key_moves_the_agent_its_way_within_the_first_chunk")
SAMPLER_REFERENCE = f"{SAMPLING}::test_batched_device_sampler_equals_the_scalar_reference"
DECODE_PATHS = "tests/unit/reasoner/test_decode_paths.py"
RING_START = ("        pending = ring_shift_start(kv, handle) if hop + 1 < handle.size "
              "else None\n")
DFLASH_DRAFTERS = "tests/unit/reasoner/test_dflash_drafters.py"
DFLASH_FITTED = f"{DFLASH_DRAFTERS}::test_a_fitted_drafter_is_accepted_and_replies_stay_lossless"
RANK_COLLECTIVES = "tests/unit/parallel/test_collectives.py"
THINKING_BUDGET = ("tests/unit/reasoner/test_chat_thinking.py"
                   "::test_budget_closes_the_block_after_exactly_the_budget")
WORLD = "tests/integration/world/test_world_semantics.py"
WORLD_IMAGES = f"{WORLD}::test_images_show_the_colour_and_background_asked_for"
WORLD_LIVE = f"{WORLD}::test_a_live_session_names_the_colour_on_screen_now"
WORLD_SOUND = f"{WORLD}::test_videos_sound_the_tone_of_the_colour_asked_for"
CFG_PARALLEL = ("tests/integration/parallel/test_cfg_engine.py"
                "::test_policy_actions_with_guidance_equal_one_process")

PLANTS: tuple[Plant, ...] = (
    # ---------------------------------------------------------------- weight mapping
    Plant(
        name="reasoner-key-swaps-gate-and-up",
        claim="the Cosmos3 reasoner's LLM is the generator's text pathway, as transformers maps it",
        path="worldserve/models/cosmos3_reasoner/text_pathway.py",
        anchor='    elif kind == "mlp" and model_type == EDGE:\n'
               '        sub = _EDGE_MLP.get(sub, sub)\n',
        replacement='    elif kind == "mlp" and model_type == EDGE:\n'
                    '        sub = _EDGE_MLP.get(sub, sub)\n'
                    '    elif kind == "mlp":\n'
                    '        sub = {"gate_proj": "up_proj", '
                    '"up_proj": "gate_proj"}.get(sub, sub)\n',
        caught_by=(SHARED_WEIGHTS,),
    ),
    Plant(
        name="reasoner-key-swaps-the-layer-norms",
        claim="the Cosmos3 reasoner's LLM is the generator's text pathway, norms included",
        path="worldserve/models/cosmos3_reasoner/text_pathway.py",
        anchor="    rest = match.group(2)\n",
        replacement="    rest = match.group(2)\n"
                    "    swap = {'input_layernorm': 'post_attention_layernorm',\n"
                    "            'post_attention_layernorm': 'input_layernorm'}\n"
                    "    head, _, tail = rest.partition('.')\n"
                    "    rest = f'{swap.get(head, head)}.{tail}'\n",
        caught_by=(SHARED_WEIGHTS,),
    ),
    # ---------------------------------------------------------------- Cosmos3 per-row schedulers
    Plant(
        name="cosmos3-rows-share-the-pipeline-scheduler",
        claim="interleaved Cosmos3 requests equal their solo runs (each row owns its scheduler)",
        path="worldserve/models/cosmos3/prepare.py",
        anchor="        scheduler = type(base).from_config(base.config, **shift)\n",
        replacement="        scheduler = base\n",
        caught_by=(COSMOS3_INTERLEAVED, COSMOS3_ENGINE_INTERLEAVED),
    ),
    Plant(
        name="thinking-budget-never-closes-the-block",
        claim="thinking_token_budget cuts the reasoning block after exactly that many tokens",
        path="worldserve/engines/reasoner/thinking.py",
        anchor="            self._queue = list(self.close_ids)\n",
        replacement="            self._queue = []\n",
        caught_by=(THINKING_BUDGET,),
    ),
    Plant(
        name="cosmos3-sound-steps-the-video-scheduler",
        claim="the stepped Cosmos3 runner equals Cosmos3OmniPipeline.__call__ (sound included)",
        path="worldserve/models/cosmos3/prepare.py",
        anchor="            sound_scheduler=copy.deepcopy(scheduler) if sound_latents",
        replacement="            sound_scheduler=scheduler if sound_latents",
        caught_by=(COSMOS3_SOUND, COSMOS3_ENGINE_INTERLEAVED),
    ),
    # ---------------------------------------------------------------- rank groups
    Plant(
        name="cfg-parallel-swaps-cond-and-uncond",
        claim="a CFG-parallel group computes what one process computes",
        path="worldserve/models/cosmos3/parallel.py",
        anchor="        return _unflatten(both[0], mine), _unflatten(both[1], mine)\n",
        replacement="        return _unflatten(both[1], mine), _unflatten(both[0], mine)\n",
        caught_by=(CFG_PARALLEL,),
    ),
    Plant(
        name="ring-merge-weights-the-old-part-wrongly",
        claim="ring attention equals full attention (log-sum-exp merge)",
        path="worldserve/levers/parallel/attention.py",
        anchor="    out = out * torch.exp(lse - new_lse).unsqueeze(-1) \\\n",
        replacement="    out = out * torch.exp(new_lse - lse).unsqueeze(-1) \\\n",
        caught_by=(RANK_COLLECTIVES,),
    ),
    Plant(
        name="halo-pads-strips-with-zeros",
        claim="strip-parallel convolutions equal the whole picture (halo exchange)",
        path="worldserve/levers/parallel/halo.py",
        anchor="    above = gathered[handle.index - 1, 1] if handle.index > 0 else zeros\n",
        replacement="    above = zeros\n",
        caught_by=(RANK_COLLECTIVES,),
    ),
    Plant(
        name="shard-rows-swapped-between-ranks",
        claim="sharded blocks compute with the checkpoint's weights",
        path="worldserve/levers/parallel/shard.py",
        anchor="    first = min(num_rows, handle.index * per)\n",
        replacement="    first = min(num_rows, (handle.size - 1 - handle.index) * per)\n",
        caught_by=(RANK_COLLECTIVES,),
    ),
    # ---------------------------------------------------------------- sampling knobs
    Plant(
        name="temperature-ignored",
        claim="temperature scales the logits before the softmax",
        path="worldserve/engines/reasoner/sampling.py",
        anchor="    logits = logits / _per_row([s.temperature for s in samplings], logits)\n",
        replacement="    logits = logits.clone()\n",
        caught_by=(f"{SAMPLING}::test_temperature_scales_the_softmax", SAMPLER_REFERENCE),
    ),
    Plant(
        name="top-k-keeps-one-more",
        claim="top-k draws only the k largest logits",
        path="worldserve/engines/reasoner/sampling.py",
        anchor="            kth = torch.topk(logits[b], s.top_k).values[-1]\n",
        replacement="            kth = torch.topk(logits[b], s.top_k + 1).values[-1]\n",
        caught_by=(f"{SAMPLING}::test_top_k_draws_only_the_k_largest", SAMPLER_REFERENCE),
    ),
    Plant(
        name="top-p-drops-the-crossing-token",
        claim="top-p keeps the smallest set of the largest probabilities reaching p",
        path="worldserve/engines/reasoner/sampling.py",
        anchor="    values = values.masked_fill(cumulative - values > top_p, 0.0)\n",
        replacement="    values = values.masked_fill(cumulative > top_p, 0.0)\n",
        caught_by=(f"{SAMPLING}::test_top_p_draws_only_the_smallest_set_reaching_p",
                   SAMPLER_REFERENCE),
    ),
    Plant(
        name="repetition-penalty-inverted",
        claim="the repetition penalty divides positive and multiplies negative seen logits",
        path="worldserve/engines/reasoner/sampling.py",
        anchor="logits > 0, logits / penalty, logits * penalty)",
        replacement="logits > 0, logits * penalty, logits / penalty)",
        caught_by=(f"{SAMPLING}::test_repetition_penalty_divides_positive_and_multiplies"
                   "_negative_seen_logits", SAMPLER_REFERENCE),
    ),
    Plant(
        name="frequency-penalty-ignored",
        claim="frequency and presence penalties count the reply's tokens",
        path="worldserve/engines/reasoner/sampling.py",
        anchor="_per_row([s.frequency_penalty for s in samplings], logits) * counts",
        replacement="0.0",
        caught_by=(f"{SAMPLING}::test_frequency_and_presence_penalties_count_reply_tokens_only",
                   SAMPLER_REFERENCE),
    ),
    Plant(
        name="session-seed-ignored",
        claim="a seeded session's replies are reproducible and depend on the seed",
        path="worldserve/engines/reasoner/session.py",
        anchor="            self.generator.manual_seed(sampling.seed)\n",
        replacement="            self.generator.manual_seed(0)\n",
        caught_by=(SEEDED,),
    ),
    # ---------------------------------------------------------------- speculation bookkeeping
    Plant(
        name="verify-keeps-a-rejected-draft",
        claim="speculative decoding (DFlash, n-gram) is lossless: rejected drafts leave no K/V",
        path="worldserve/engines/reasoner/execute.py",
        anchor="                num_kept = i + 1\n",
        replacement="                num_kept = min(i + 2, len(fed))\n",
        caught_by=(DFLASH_SAMPLED, NGRAM_LOSSLESS),
    ),
    Plant(
        name="dflash-accepted-drafts-not-counted",
        claim="a drafter fitted to the target has its drafts accepted (and says so)",
        path="worldserve/engines/reasoner/execute.py",
        anchor="            self.proposer.num_accepted += num_kept - 1\n",
        replacement="            self.proposer.num_accepted += 0\n",
        caught_by=(DFLASH_FITTED,),
    ),
    Plant(
        name="published-drafter-loses-its-rope-theta",
        claim="a drafter in a published layout loads as the same network",
        path="worldserve/models/dflash/layouts.py",
        anchor='"rope_theta": layers.get("rope_theta", 10000.0)}',
        replacement='"rope_theta": 10000.0}',
        caught_by=(f"{DFLASH_DRAFTERS}::test_published_layouts_load_as_the_same_drafter",),
    ),
    # ---------------------------------------------------------------- the static decode step
    Plant(
        name="static-step-swaps-q-and-k-norms",
        claim="the static decode step equals transformers' forward",
        path="worldserve/models/qwen_vl/decode.py",
        anchor="        q, k = _rms(q, norms[2]), _rms(k, norms[3])\n",
        replacement="        q, k = _rms(q, norms[3]), _rms(k, norms[2])\n",
        caught_by=(f"{DECODE_PATHS}::test_static_step_equals_transformers_forward",),
    ),
    Plant(
        name="dflash-drafter-cache-keeps-rejected-drafts",
        claim="the DFlash drafter cache follows the target cache token for token",
        path="worldserve/engines/reasoner/dflash.py",
        anchor="        self.inner.truncate(length)\n        self.drafter.truncate(length)\n",
        replacement="        self.inner.truncate(length)\n",
        caught_by=(DFLASH_SAMPLED,),
    ),
    # ---------------------------------------------------------------- cluster job ids and listing
    Plant(
        name="merged-listing-ignores-the-replica-order",
        claim="GET /v1/videos over several api replicas equals one sort of all their jobs",
        path="worldserve/cluster/listing.py",
        anchor="    return (created_at, 0) if replica > owner else (created_at, LAST_SEQ)\n",
        replacement="    return created_at, seq\n",
        caught_by=("tests/unit/cluster/test_listing.py"
                   "::test_walking_the_pages_gives_the_reference_order",),
    ),
    Plant(
        name="output-stem-allows-a-path",
        claim="an output stem (a job id) can never name a path outside the output directory",
        path="worldserve/engines/generation/outputs.py",
        anchor='_STEM = re.compile(rf"{_WORD}(\\.{_WORD})?")\n',
        replacement='_STEM = re.compile(r"[A-Za-z0-9._/-]+")\n',
        caught_by=("tests/unit/cluster/test_job_ids.py"
                   "::test_stems_outside_the_id_alphabet_are_refused",),
    ),
    # ---------------------------------------------------------------- single-device speed, FP8
    Plant(
        name="step-cache-rows-share-context-names",
        claim="cached requests interleaved on one transformer equal their solo cached runs",
        path="worldserve/levers/step_cache.py",
        anchor='        context = f"{row.cache.key}/{name}" if row.cache.key else name\n',
        replacement="        context = name\n",
        caught_by=("tests/unit/models/test_step_cache.py"
                   "::test_interleaved_cached_rows_equal_their_solo_cached_runs",),
    ),
    Plant(
        name="kv-reuse-replays-the-cond-prompt-for-uncond",
        claim="understanding K/V reuse equals recomputation (cond and uncond recorded apart)",
        path="worldserve/models/cosmos3/denoise.py",
        anchor="        slot = row.understanding_kv.setdefault(name, UnderstandingKV())\n",
        replacement='        slot = row.understanding_kv.setdefault("cond", UnderstandingKV())\n',
        caught_by=("tests/unit/models/test_cosmos3_speed.py"
                   "::test_reuse_equals_recomputation_and_skips_the_understanding_stream",),
    ),
    Plant(
        name="fp8-w8a16-drops-the-weight-scale",
        claim="an FP8 checkpoint served W8A16 computes what its dequantised checkpoint computes",
        path="worldserve/levers/fp8/weights.py",
        anchor="    return (weight * scale).to(dtype)\n",
        replacement="    return weight.to(dtype)\n",
        caught_by=("tests/unit/fp8/test_cosmos3_fp8.py"
                   "::test_greedy_session_replies_equal_the_dequantised_checkpoint",),
    ),
    # ---------------------------------------------------------------- meaning (trained dev world)
    Plant(
        name="cosmos3-prompt-dropped",
        claim="a Cosmos3 image shows the colour and background its prompt asks for",
        path="worldserve/models/cosmos3/prepare.py",
        anchor="            params.prompt, negative, num_frames=num_frames,",
        replacement="            \"\", negative, num_frames=num_frames,",
        caught_by=(WORLD_IMAGES,),
    ),
    Plant(
        name="cosmos3-guidance-sign-flipped",
        claim="classifier-free guidance pushes toward the prompt, not away from it",
        path="worldserve/models/cosmos3/denoise.py",
        anchor="    return uncond + guidance * (cond - uncond)\n",
        replacement="    return uncond - guidance * (cond - uncond)\n",
        caught_by=(WORLD_IMAGES,),
    ),
    Plant(
        name="cosmos3-sound-ignores-the-prompt",
        claim="a video's sound is denoised under the prompt's conditioning, like its frames",
        path="worldserve/models/cosmos3/denoise.py",
        anchor="                velocity[1].unsqueeze(0), t, row.sound_latents.unsqueeze(0),\n",
        replacement="                uncond[1].unsqueeze(0), t, row.sound_latents.unsqueeze(0),\n",
        caught_by=(WORLD_SOUND,),
    ),
    Plant(
        name="live-session-fed-a-stale-frame",
        claim="a live reasoning session answers about the frame just sent",
        path="worldserve/engines/reasoner/prompt.py",
        anchor="        image = self.prompting.read_image(data)\n",
        replacement=("        image = self.__dict__.setdefault(\"_first\",\n"
                     "                                         self.prompting.read_image(data))\n"),
        caught_by=(WORLD_LIVE,),
    ),
    Plant(
        name="step-cache-rows-share-a-context",
        claim="several seeds of one cached request each equal their solo cached run",
        path="worldserve/levers/step_cache.py",
        anchor='        context = f"{row.cache.key}/{name}" if row.cache.key else name\n',
        replacement='        context = f"shared/{name}" if row.cache.key else name\n',
        caught_by=("tests/unit/models/test_cosmos3_speed.py"
                   "::test_step_cache_for_several_seeds_of_one_request_equals_each_seeds_solo_run",),
    ),
    Plant(
        name="rank-peers-draw-every-row-from-the-first-seed",
        claim="several seeds of one request on a rank group each equal their solo run",
        path="worldserve/ranks/worker.py",
        anchor="self.runner.prepare(c.row_owner, c.rows, c.seeds)",
        replacement="self.runner.prepare(c.row_owner, c.rows, [c.seeds[0]] * len(c.seeds))",
        caught_by=("tests/integration/parallel/test_ulysses.py"
                   "::test_several_seeds_of_one_request_equal_each_seeds_solo_request",),
    ),
    Plant(
        name="chunked-decode-rows-share-the-first-rows-job",
        claim="several seeds of one request decoded in chunks each equal their solo request",
        path="worldserve/models/cosmos3/decode.py",
        anchor="        r = state.rows[row]\n        if r.decode_job is None:",
        replacement="        r = state.rows[0]\n        if r.decode_job is None:",
        caught_by=("tests/unit/generation/test_vae_decode.py"
                   "::test_several_seeds_of_one_request_decoded_in_chunks_equal_each_seeds_solo_"
                   "request",),
    ),
    Plant(
        name="wan-guidance-takes-the-first-rows-uncond",
        claim="each seed of a batched Wan request (one forward, B = seeds) equals its solo run",
        path="worldserve/models/wan/runner.py",
        anchor="noise_pred = uncond + guidance * (noise_pred - uncond)",
        replacement="noise_pred = uncond[:1] + guidance * (noise_pred - uncond[:1])",
        caught_by=("tests/unit/generation/test_wan_speed.py"
                   "::test_compiled_blocks_give_each_seed_of_a_batch_its_solo_run",),
    ),
    Plant(
        name="realtime-camera-keys-ignored",
        claim="a realtime session's held keys steer the trained causal model (d moves right)",
        path="worldserve/models/causal_dit/runner.py",
        anchor="cam = camera_vectors(camera, counts, max_entries)[None]",
        replacement="cam = camera_vectors(None, counts, max_entries)[None]",
        caught_by=(REALTIME_STEERS,),
    ),
    Plant(
        name="realtime-keys-mirrored",
        claim="each camera key lands on its own column of the camera vectors (d is not a)",
        path="worldserve/models/causal_dit/camera.py",
        anchor="                vectors[latent, KEY_INDEX[key]] += 1.0 / count",
        replacement="                vectors[latent, KEY_INDEX[{'a': 'd', 'd': 'a'}.get(key, key)]]"
                    " += 1.0 / count",
        caught_by=(REALTIME_STEERS,),
    ),
    Plant(
        name="w8a8-input-scale-taken-from-the-batch",
        claim="W8A8 sessions decoded in one batch each equal their solo session",
        path="worldserve/levers/fp8/linear.py",
        anchor="scale_a, scale_b = self.input_scale, self.weight_scale",
        replacement="scale_a, scale_b = _dynamic_row_scales(x2).amax(), self.weight_scale",
        caught_by=("tests/unit/fp8/test_cosmos3_fp8.py"
                   "::test_reasoner_w8a8_sessions_differing_by_seed_batched_each_equal_their_solo_"
                   "session",),
    ),
    Plant(
        name="w8a8-dynamic-scale-over-the-batch",
        claim="without input scales, a row's W8A8 output does not depend on its batch-mates",
        path="worldserve/levers/fp8/linear.py",
        anchor="scale_a = _dynamic_row_scales(x2)",
        replacement="scale_a = _dynamic_row_scales(x2).amax().expand(x2.shape[0], 1).contiguous()",
        caught_by=("tests/unit/fp8/test_linear.py"
                   "::test_fp8_linear_without_an_input_scale_quantises_each_row_alone",),
    ),
    Plant(
        name="api-mmap-threshold-left-to-glibc",
        claim="the api keeps megabyte blocks in their own mappings after a large block is freed",
        path="worldserve/api/allocator.py",
        anchor="libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1",
        replacement="libc.mallopt(M_MMAP_THRESHOLD, 32 << 20) == 1",
        caught_by=("tests/unit/core/test_allocator.py"
                   "::test_held_thresholds_keep_megabyte_blocks_off_the_heap",),
    ),
    Plant(
        name="api-trim-threshold-left-to-glibc",
        claim="the api gives megabytes freed at the heap's top back to the system",
        path="worldserve/api/allocator.py",
        anchor="libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) == 1",
        replacement="libc.mallopt(M_TRIM_THRESHOLD, 8 << 20) == 1",
        caught_by=("tests/unit/core/test_allocator.py"
                   "::test_held_thresholds_give_a_freed_heap_top_back",),
    ),
    Plant(
        name="api-free-heap-pages-kept",
        claim="the api hands free pages inside its heap back to the system every minute",
        path="worldserve/api/allocator.py",
        anchor="        await asyncio.to_thread(give_back_free_pages)",
        replacement="        await asyncio.to_thread(bool)",
        caught_by=("tests/unit/core/test_allocator.py"
                   "::test_free_pages_inside_the_heap_go_back_while_the_api_lives",),
    ),
    Plant(
        name="min-tokens-ignored",
        claim="min_tokens holds a reply's end of turn back until it is that long",
        path="worldserve/engines/reasoner/decoding.py",
        anchor="            return self._no_stop if short else None",
        replacement="            return None",
        caught_by=("tests/unit/reasoner/test_reply_length.py"
                   "::test_min_tokens_masks_end_of_turn_until_the_reply_holds_that_many",
                   "tests/integration/world/test_world_dflash.py"
                   "::test_min_tokens_and_ignore_eos_run_on_past_the_answer_and_stay_lossless"),
    ),
    Plant(
        name="ignore-eos-ignored",
        claim="ignore_eos keeps a reply going past its end of turn",
        path="worldserve/engines/reasoner/decoding.py",
        anchor="            if not self.sampling.ignore_eos:",
        replacement="            if True:",
        caught_by=("tests/unit/reasoner/test_reply_length.py"
                   "::test_ignore_eos_runs_to_max_tokens_and_keeps_end_of_turn_out_of_the_text",
                   "tests/integration/world/test_world_dflash.py"
                   "::test_min_tokens_and_ignore_eos_run_on_past_the_answer_and_stay_lossless"),
    ),
    Plant(
        name="plan-sums-an-unchunked-decode",
        claim="an unchunked VAE decode is planned as the larger of it and a step, not the sum",
        path="worldserve/runtime/placement.py",
        anchor="    transient = step + vae if demand.decode_interleaves else max(step, vae)\n",
        replacement="    transient = step + vae\n",
        caught_by=("tests/unit/core/test_placement.py::test_headroom_formula",),
    ),
    Plant(
        name="ring-hop-waits-before-it-computes",
        claim="the next ring hop's exchange is under way while a hop computes",
        path="worldserve/levers/parallel/attention.py",
        anchor=RING_START,
        # the serial hop: wait for the exchange at once, then compute
        replacement=(RING_START
                     + "        kv_next = pending.wait() if pending is not None else None\n"
                     "        pending = type('Done', (), {'wait': lambda self: kv_next})() "
                     "if kv_next is not None else None\n"),
        caught_by=("tests/unit/parallel/test_ring_hop.py"
                   "::test_the_next_hop_is_under_way_while_a_hop_computes",),
    ),
    Plant(
        name="graph-replays-the-captured-inputs",
        claim="a replayed decode step decodes this step's tokens, not the captured step's",
        path="worldserve/models/qwen_vl/graphs.py",
        anchor=("            graph.plan.copy_(host, non_blocking=True)  "
                "# pinned on CUDA (_host_plan)\n"),
        replacement="            pass\n",
        caught_by=("tests/unit/reasoner/test_decode_graphs.py"
                   "::test_replayed_steps_equal_the_static_step",
                   "tests/unit/reasoner/test_decode_graphs.py"
                   "::test_engine_replies_with_graphs_equal_the_static_step"),
    ),
    Plant(
        name="graph-kept-after-its-buffers-moved",
        claim="a graph replays only over the buffers it was captured with",
        path="worldserve/models/qwen_vl/graphs.py",
        anchor="        key = (batch, width, *((t.data_ptr(), *t.shape) for t in buffers))\n",
        replacement="        key = (batch, width)\n",
        caught_by=("tests/unit/reasoner/test_decode_graphs.py"
                   "::test_replayed_steps_equal_the_static_step",
                   "tests/unit/reasoner/test_decode_graphs.py"
                   "::test_a_graph_replays_until_its_buffers_move"),
    ),
)
