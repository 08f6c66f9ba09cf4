"""Cosmos3 reasoners (Omni: Nano/Super, a Qwen3-VL; Edge: SigLIP2 + squared-ReLU LLM) through
transformers, served by the Qwen-VL runner on the reasoner stage."""
