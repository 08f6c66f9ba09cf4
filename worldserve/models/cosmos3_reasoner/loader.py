"""Load a Cosmos3 reasoner directory into the Qwen-VL runner (the same session cache, chunked
prefill and batched decode serve Omni, a Qwen3-VL, and Edge).

Checks first what would otherwise fail deep inside transformers: a quantised (ModelOpt FP8)
checkpoint on a device that cannot run it.
"""

from __future__ import annotations

from pathlib import Path

from worldserve.models.detect import read_json
from worldserve.models.qwen_vl.processor import load_vlm
from worldserve.models.qwen_vl.runner import QwenVLRunner
from worldserve.models.types import ModelLoadError

MODELOPT_STATE = "modelopt_state.pth"


def load_runner(model_dir: Path, *, dtype: str = "float32", device: str = "cpu") -> QwenVLRunner:
    """The registry's reasoner loader for a Cosmos3 reasoner directory."""
    quantization = quantization_method(model_dir)
    if quantization and not str(device).startswith("cuda"):
        raise ModelLoadError(
            f"{model_dir} holds {quantization}-quantised weights, which need a CUDA GPU; "
            f"the reasoner stage was configured for device {device!r}. Use a bf16 checkpoint "
            "on CPU, or serve this one on a GPU")
    try:
        model, processor = load_vlm(model_dir, dtype=dtype, device=device)
        return QwenVLRunner(model, processor)
    except Exception as exc:
        raise ModelLoadError(f"cannot load the Cosmos3 reasoner from {model_dir}: "
                             f"{exc}") from exc


def quantization_method(model_dir: Path) -> str | None:
    """"fp8" (or the config's `quant_method`) when the checkpoint is quantised, else None."""
    model_dir = Path(model_dir)
    config = read_json(model_dir / "config.json") or {}
    quant = config.get("quantization_config")
    if isinstance(quant, dict):
        return str(quant.get("quant_method") or quant.get("quant_algo") or "unknown")
    if (model_dir / MODELOPT_STATE).is_file():
        return "ModelOpt fp8"
    return None
