"""ModelOpt FP8 checkpoints: detected from their files, loaded W8A16 (dequantised once at load)
or W8A8 (CUDA sm89+), or refused with a message; never upcast without their scales.

`detect` reads files only (no torch); `load` builds the Cosmos3 generator transformer and the
reasoner model; `linear.Fp8Linear` is the W8A8 layer; `dev` writes tiny FP8 checkpoints.
"""
