"""A model config as the command line of the backend that serves it: the bundled CPU backend, TGI's
``text-generation-launcher`` or ``vllm serve``.

The table of docs/backends.md, in code: each config field becomes the backend's own flag, with the values
that backend documents (TGI's launcher reference, vLLM's engine arguments). The flags this module sets are
refused in ``backend_args``, where they would silently contradict the config.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from oasst_shared.model_configs import ModelConfig
from oasst_worker.settings import WorkerSettings

# Config quantization -> TGI `--quantize` (None: no flag). TGI's "bitsandbytes" is 8-bit.
TGI_QUANTIZE: dict[str, str | None] = {
    "none": None,
    "awq": "awq",
    "gptq": "gptq",
    "marlin": "marlin",
    "exl2": "exl2",
    "eetq": "eetq",
    "fp8": "fp8",
    "compressed-tensors": "compressed-tensors",
    "bitsandbytes": "bitsandbytes",
    "bitsandbytes-nf4": "bitsandbytes-nf4",
    "bitsandbytes-fp4": "bitsandbytes-fp4",
    "int8": "bitsandbytes",
    "int4": "bitsandbytes-nf4",
}
# Config quantization -> vLLM `--quantization`. vLLM's in-flight "bitsandbytes" is 4-bit NF4.
VLLM_QUANTIZATION: dict[str, str | None] = {
    "none": None,
    "awq": "awq",
    "gptq": "gptq",
    "marlin": "marlin",
    "fp8": "fp8",
    "compressed-tensors": "compressed-tensors",
    "bitsandbytes": "bitsandbytes",
    "bitsandbytes-nf4": "bitsandbytes",
    "int4": "bitsandbytes",
}
TGI_DTYPE: dict[str, str | None] = {"auto": None, "float16": "float16", "bfloat16": "bfloat16"}
VLLM_DTYPE: dict[str, str | None] = {
    "auto": None,
    "float16": "float16",
    "bfloat16": "bfloat16",
    "float32": "float32",
}

# Flags set from the config or the worker: refused in backend_args (with the config field to use instead).
TGI_RESERVED = {
    "--model-id": "model_id or model_path",
    "--hostname": "the worker's managed_backend_host",
    "--port": "the worker's managed_backend_port",
    "-p": "the worker's managed_backend_port",
    "--quantize": "quantization",
    "--dtype": "dtype",
    "--num-shard": "gpus_per_replica",
    "--sharded": "gpus_per_replica",
    "--max-total-tokens": "max_total_length",
    "--max-input-tokens": "max_input_length",
    "--max-input-length": "max_input_length",
    "--max-concurrent-requests": "parallel_requests",
}
VLLM_RESERVED = {
    "--model": "model_id or model_path",
    "--host": "the worker's managed_backend_host",
    "--port": "the worker's managed_backend_port",
    "--quantization": "quantization",
    "-q": "quantization",
    "--dtype": "dtype",
    "--tensor-parallel-size": "gpus_per_replica",
    "-tp": "gpus_per_replica",
    "--max-model-len": "max_total_length",
    "--max-num-seqs": "parallel_requests",
    "--served-model-name": "model_id",
}


class LaunchError(ValueError):
    """The config cannot be started by this backend; ``field`` names the config field at fault."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(message)
        self.field = field_name


@dataclass(frozen=True)
class Launch:
    """A backend process to start: its arguments and what it adds to the worker's environment."""

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)


def launch(
    config: ModelConfig,
    *,
    kind: str,
    host: str,
    port: int,
    gpus: list[str],
    command: list[str] | None = None,
    model_configs_dir: str | None = None,
) -> Launch:
    """The process that serves ``config`` on ``host:port`` with ``gpus`` (CUDA_VISIBLE_DEVICES)."""
    env = {"CUDA_VISIBLE_DEVICES": ",".join(gpus)} if gpus else {}
    if kind == "cpu":
        return Launch(
            command or [sys.executable, "-m", "oasst_cpu_backend"],
            {**env, **cpu_env(config, host, port, model_configs_dir)},
        )
    if kind == "tgi":
        return Launch([*(command or ["text-generation-launcher"]), *tgi_args(config, host, port)], env)
    if kind == "vllm":
        return Launch([*(command or ["vllm", "serve"]), *vllm_args(config, host, port)], env)
    raise LaunchError("backend", f"the worker does not start {kind!r} backends")


def launch_for(settings: WorkerSettings, config: ModelConfig, *, port: int, gpus: list[str]) -> Launch:
    """:func:`launch` with what the worker's settings say (backend kind, address, command, registry)."""
    return launch(
        config,
        kind=settings.managed_backend,
        host=settings.managed_backend_host,
        port=port,
        gpus=gpus,
        command=settings.managed_backend_command,
        model_configs_dir=str(settings.model_configs_dir) if settings.model_configs_dir else None,
    )


def cpu_env(config: ModelConfig, host: str, port: int, model_configs_dir: str | None) -> dict[str, str]:
    """The bundled backend reads the config itself, from the same registry, by name."""
    env = {
        "OASST_CPU_BACKEND_HOST": host,
        "OASST_CPU_BACKEND_PORT": str(port),
        "OASST_CPU_BACKEND_MODEL_CONFIG_NAME": config.name,
    }
    if model_configs_dir:
        env["OASST_CPU_BACKEND_MODEL_CONFIGS_DIR"] = model_configs_dir
    return env


def tgi_args(config: ModelConfig, host: str, port: int) -> list[str]:
    """``text-generation-launcher`` arguments (its reference: docs/source/reference/launcher.md)."""
    args = ["--model-id", config.model_path or config.model_id, "--hostname", host, "--port", str(port)]
    args += ["--num-shard", str(max(1, config.gpus_per_replica))]
    quantize = _mapped(TGI_QUANTIZE, config.quantization, "quantization", "TGI")
    if quantize == "exl2" and config.gpus_per_replica > 1:
        raise LaunchError("gpus_per_replica", "TGI's exl2 kernels do not support sharding (num_shard > 1)")
    if quantize:
        args += ["--quantize", quantize]
    dtype = _mapped(TGI_DTYPE, config.dtype, "dtype", "TGI")
    if dtype:
        args += ["--dtype", dtype]
    if "max_total_length" in config.explicit_fields:
        args += ["--max-total-tokens", str(config.max_total_length)]
        args += ["--max-input-tokens", str(config.max_input_length)]
    if config.parallel_requests:
        args += ["--max-concurrent-requests", str(config.parallel_requests)]
    return args + _extra(config, TGI_RESERVED)


def vllm_args(config: ModelConfig, host: str, port: int) -> list[str]:
    """``vllm serve`` arguments (its engine arguments: vllm/engine/arg_utils.py)."""
    args = [config.model_path or config.model_id, "--host", host, "--port", str(port)]
    # The worker asks for the model by its id, whatever path vLLM loaded it from.
    args += ["--served-model-name", config.model_id]
    args += ["--tensor-parallel-size", str(max(1, config.gpus_per_replica))]
    quantization = _mapped(VLLM_QUANTIZATION, config.quantization, "quantization", "vLLM")
    if quantization:
        args += ["--quantization", quantization]
    dtype = _mapped(VLLM_DTYPE, config.dtype, "dtype", "vLLM")
    if dtype:
        args += ["--dtype", dtype]
    if "max_total_length" in config.explicit_fields:
        args += ["--max-model-len", str(config.max_total_length)]
    if config.parallel_requests:
        args += ["--max-num-seqs", str(config.parallel_requests)]
    return args + _extra(config, VLLM_RESERVED)


def _mapped(table: dict[str, str | None], value: str, field_name: str, backend: str) -> str | None:
    if value not in table:
        raise LaunchError(
            field_name, f"{backend} has no {field_name} {value!r}; it takes: {', '.join(sorted(table))}"
        )
    return table[value]


def _extra(config: ModelConfig, reserved: dict[str, str]) -> list[str]:
    for arg in config.backend_args:
        flag = arg.split("=", 1)[0]
        if flag in reserved:
            raise LaunchError(
                "backend_args", f"{flag} is set from {reserved[flag]}; remove it from backend_args"
            )
    return list(config.backend_args)
