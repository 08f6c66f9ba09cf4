"""DFlash block-diffusion drafters (transformers' `muse_glimmer_assistant`) for the reasoner."""
