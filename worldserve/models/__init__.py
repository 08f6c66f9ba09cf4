"""Model loaders (VLM, diffusion pipelines) and the dev checkpoint builders.

Everything under this package imports torch, transformers or diffusers: stage processes and the
CLI use it; the api process never imports it.
"""
