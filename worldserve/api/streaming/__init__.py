"""Live video reasoning (spec streaming-reasoning.md): sessions, frames, WebSocket connections,
chat completions. The services here relay to the reasoner stage; they never load a model."""
