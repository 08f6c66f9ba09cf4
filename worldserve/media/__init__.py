"""Media handling shared by the api process and the stages (numpy, Pillow, PyAV only)."""
