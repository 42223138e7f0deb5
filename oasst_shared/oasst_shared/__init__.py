"""Shared by the inference server, the worker and the clients: protocol, sampling, model configs."""

from oasst_shared.model_configs import MODEL_CONFIGS, ModelConfig, get_model_config
from oasst_shared.protocol import MIN_SUPPORTED_PROTOCOL_VERSION, PROTOCOL_VERSION
from oasst_shared.sampling import SamplingParameters

__all__ = [
    "MIN_SUPPORTED_PROTOCOL_VERSION",
    "MODEL_CONFIGS",
    "PROTOCOL_VERSION",
    "ModelConfig",
    "SamplingParameters",
    "get_model_config",
]
