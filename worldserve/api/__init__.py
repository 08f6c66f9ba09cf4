"""The api process: FastAPI app, thin routes, relays to stage processes.

Nothing under this package may import torch, transformers or diffusers.
"""
