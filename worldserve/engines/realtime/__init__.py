"""Realtime engine: a causal video model driven chunk by chunk with per-session state."""
