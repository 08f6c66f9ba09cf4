"""The NIM surfaces: the Generator NIM's `/v1/infer` (schema, rules, translation) and what NIM
clients read about a runtime (metadata, manifest, health, the runtime-aware 404); docs/nim.md."""
