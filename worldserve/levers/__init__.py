"""Levers: what a stage switches on a loaded model, beside the families that use them.

FP8 weights (`fp8/`), the collectives and sharding math of a rank group (`parallel/`), step
caching (`step_cache.py`), attention backends and regional compilation (`speed.py`), yield
points for a colocated stage (`yielding.py`) and the modules one loader publishes for another
in the same process (`shared.py`), LoRA adapters (`lora.py`), and the runner side of LoRA,
weight updates and memory release on a diffusers pipeline (`diffusers_admin.py`). A family
(`models/<family>/`) attaches the levers it supports; a lever knows no family, and imports only
the shared model types (`models/types.py`, `detect.py`, `common.py`) below it.
"""
