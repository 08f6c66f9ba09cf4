"""Reasoner engine: a vision-language model with per-session KV caches."""
