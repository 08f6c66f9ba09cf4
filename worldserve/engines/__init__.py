"""Engines: the model-owning code that runs inside stage processes (imports torch)."""
