"""Server and stage configuration: pydantic models, validated once, frozen.

A YAML file (`--config`) gives the whole tree; the environment and CLI flags override single
fields (flag > environment > YAML > default). Unknown keys are refused and every error names
the dotted path of the offending key. Split as vLLM splits its config:

- `server`: the HTTP server and the stages it runs (`ServerConfig`, `StagesConfig`);
- `loading`: what every stage loads and where (`StageConfig`: device, dtype, FP8), and the
  generation stage's rank group (`GenerationParallelConfig`);
- `generation`, `reasoner`, `realtime`: one stage each, with its levers;
- `sources`: YAML, environment and override plumbing (`load_config`, `build_config`);
- `flags`: the `serve` / `check` flags made from the fields (imported by the CLI only).
"""

from worldserve.config.base import (
    LOOPBACK_NAMES,
    OWNED_OVERRIDES,
    ConfigError,
    FrozenConfig,
    is_loopback_host,
)
from worldserve.config.generation import (
    ATTENTION_BACKENDS,
    UNSUPPORTED_STEP_CACHES,
    GenerationStageConfig,
    StepCacheConfig,
)
from worldserve.config.loading import (
    BF16_MIN_CAPABILITY,
    DEVICE_PATTERN,
    PARALLEL_AXES,
    DtypeName,
    GenerationParallelConfig,
    StageConfig,
    check_device_name,
    resolve_dtype_name,
)
from worldserve.config.realtime import RealtimeStageConfig
from worldserve.config.reasoner import ReasonerStageConfig, StreamingConfig
from worldserve.config.server import ServerConfig, StagesConfig
from worldserve.config.sources import build_config, format_validation_error, load_config, read_yaml

__all__ = [
    "ATTENTION_BACKENDS", "BF16_MIN_CAPABILITY", "DEVICE_PATTERN", "LOOPBACK_NAMES",
    "OWNED_OVERRIDES", "PARALLEL_AXES", "UNSUPPORTED_STEP_CACHES", "ConfigError", "DtypeName",
    "FrozenConfig", "GenerationParallelConfig", "GenerationStageConfig", "RealtimeStageConfig",
    "ReasonerStageConfig", "ServerConfig", "StageConfig", "StagesConfig", "StepCacheConfig",
    "StreamingConfig", "build_config", "check_device_name", "format_validation_error",
    "is_loopback_host", "load_config", "read_yaml", "resolve_dtype_name",
]
