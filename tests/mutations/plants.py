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
        path="worldserve/models/cosmos3/runner.py",
        anchor="        scheduler = type(base).from_config(base.config)\n",
        replacement="        scheduler = base\n",
        caught_by=(COSMOS3_INTERLEAVED, COSMOS3_ENGINE_INTERLEAVED),
    ),
    Plant(
        name="cosmos3-sound-steps-the-video-scheduler",
        claim="the stepped Cosmos3 runner equals Cosmos3OmniPipeline.__call__ (sound included)",
        path="worldserve/models/cosmos3/runner.py",
        anchor="            sound_scheduler=copy.deepcopy(scheduler) if sound_latents",
        replacement="            sound_scheduler=scheduler if sound_latents",
        caught_by=(COSMOS3_SOUND, COSMOS3_ENGINE_INTERLEAVED),
    ),
    # ---------------------------------------------------------------- sampling knobs
    # (temperature, top-k, top-p and the penalties: plants anchored in the sampler, caught by
    # tests/unit/reasoner/test_sampling.py, land with that file)
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
        path="worldserve/engines/reasoner/decoding.py",
        anchor="            num_kept = i + 1\n",
        replacement="            num_kept = min(i + 2, len(fed))\n",
        caught_by=(DFLASH_SAMPLED, NGRAM_LOSSLESS),
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
)
