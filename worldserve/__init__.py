"""worldserve: a serving engine for world foundation models."""

__version__ = "0.1.0"
