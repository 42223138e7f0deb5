"""Model configs as the command lines of TGI and vLLM: every value a config may give maps to a value the
backend documents, and the flags the config sets cannot be contradicted in backend_args.

The documented values, as of the sources they are copied from:
* TGI: docs/source/reference/launcher.md (huggingface/text-generation-inference, commit 032fc4c):
  `--quantize` and `--dtype` "Possible values".
* vLLM: `QuantizationMethods` in vllm/model_executor/layers/quantization/__init__.py (commit 0034007) and
  `ModelDType` in vllm/config (`--dtype` choices).
"""

from __future__ import annotations

import sys

import pytest

from oasst_shared.model_configs import DTYPE_BY_BACKEND, QUANTIZATION_BY_BACKEND, ModelConfig
from oasst_worker.managed.launch import (
    TGI_DTYPE,
    TGI_QUANTIZE,
    VLLM_DTYPE,
    VLLM_QUANTIZATION,
    LaunchError,
    launch,
    tgi_args,
    vllm_args,
)
from oasst_worker.managed.supervisor import GpuAssignmentError, gpu_groups

TGI_DOCUMENTED_QUANTIZE = {
    "awq",
    "compressed-tensors",
    "eetq",
    "exl2",
    "gptq",
    "marlin",
    "bitsandbytes",
    "bitsandbytes-nf4",
    "bitsandbytes-fp4",
    "fp8",
}
TGI_DOCUMENTED_DTYPE = {"float16", "bfloat16"}
VLLM_DOCUMENTED_QUANTIZATION = {
    "aqlm", "awq", "deepspeedfp", "tpu_int8", "fp8", "ptpc_fp8", "fbgemm_fp8", "deepgemm_fp8", "modelopt",
    "modelopt_fp4", "marlin", "bitblas", "gguf", "gptq_marlin_24", "gptq_marlin", "gptq_bitblas", "awq_marlin",
    "gptq", "compressed-tensors", "bitsandbytes", "qqq", "hqq", "experts_int8", "neuron_quant", "ipex", "quark",
    "moe_wna16", "torchao", "auto-round",
}  # fmt: skip
VLLM_DOCUMENTED_DTYPE = {"auto", "half", "float16", "bfloat16", "float", "float32"}


def config(**fields: object) -> ModelConfig:
    return ModelConfig.model_validate({"name": "m", "model_id": "org/m", **fields})


@pytest.mark.parametrize(
    ("backend", "table", "documented", "accepted"),
    [
        ("tgi", TGI_QUANTIZE, TGI_DOCUMENTED_QUANTIZE, QUANTIZATION_BY_BACKEND["tgi"]),
        ("vllm", VLLM_QUANTIZATION, VLLM_DOCUMENTED_QUANTIZATION, QUANTIZATION_BY_BACKEND["vllm"]),
        ("tgi", TGI_DTYPE, TGI_DOCUMENTED_DTYPE, DTYPE_BY_BACKEND["tgi"]),
        ("vllm", VLLM_DTYPE, VLLM_DOCUMENTED_DTYPE, DTYPE_BY_BACKEND["vllm"]),
    ],
)
def test_every_accepted_value_maps_to_a_documented_one(
    backend: str, table: dict[str, str | None], documented: set[str], accepted: frozenset[str]
) -> None:
    # What a config may say for the backend (checked when the registry loads) is what the mapping knows.
    assert set(table) == set(accepted)
    for value, flag in table.items():
        assert flag is None if value in ("none", "auto") else flag in documented, (backend, value, flag)


def test_tgi_command_line() -> None:
    awq = config(
        model_path="/models/llama-awq",
        quantization="awq",
        gpus_per_replica=2,
        max_total_length=4096,
        parallel_requests=64,
        backend_args=["--max-batch-prefill-tokens", "4096", "--trust-remote-code"],
    )
    assert tgi_args(awq, "127.0.0.1", 8080) == [
        "--model-id", "/models/llama-awq", "--hostname", "127.0.0.1", "--port", "8080", "--num-shard", "2",
        "--quantize", "awq", "--max-total-tokens", "4096", "--max-input-tokens", "3072",
        "--max-concurrent-requests", "64", "--max-batch-prefill-tokens", "4096", "--trust-remote-code",
    ]  # fmt: skip
    plain = config(dtype="bfloat16")
    assert tgi_args(plain, "0.0.0.0", 80) == [
        "--model-id", "org/m", "--hostname", "0.0.0.0", "--port", "80", "--num-shard", "1", "--dtype", "bfloat16",
    ]  # fmt: skip
    assert "--quantize bitsandbytes-nf4" in " ".join(tgi_args(config(quantization="int4"), "h", 1))


def test_vllm_command_line() -> None:
    qwen = config(
        backend="vllm",
        model_id="Qwen/Qwen2.5-7B-Instruct-AWQ",
        quantization="awq",
        dtype="float16",
        gpus_per_replica=4,
        max_total_length=8192,
        parallel_requests=128,
        backend_args=["--gpu-memory-utilization=0.85"],
    )
    assert vllm_args(qwen, "127.0.0.1", 8000) == [
        "Qwen/Qwen2.5-7B-Instruct-AWQ", "--host", "127.0.0.1", "--port", "8000",
        "--served-model-name", "Qwen/Qwen2.5-7B-Instruct-AWQ", "--tensor-parallel-size", "4",
        "--quantization", "awq", "--dtype", "float16", "--max-model-len", "8192", "--max-num-seqs", "128",
        "--gpu-memory-utilization=0.85",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("fields", "field", "message"),
    [
        ({"backend_args": ["--quantize", "gptq"]}, "backend_args", "--quantize is set from quantization"),
        ({"backend_args": ["--port=9"]}, "backend_args", "managed_backend_port"),
        ({"backend": "vllm", "backend_args": ["-tp", "2"]}, "backend_args", "set from gpus_per_replica"),
        ({"quantization": "exl2", "gpus_per_replica": 2}, "gpus_per_replica", "do not support sharding"),
    ],
)
def test_refused_command_lines_name_the_field(fields: dict[str, object], field: str, message: str) -> None:
    c = config(**fields)
    with pytest.raises(LaunchError, match=message) as caught:
        launch(c, kind=c.backend, host="h", port=1, gpus=[])
    assert caught.value.field == field


def test_the_bundled_backend_is_given_the_config_by_name() -> None:
    smol = config(backend="cpu", quantization="q8_0")
    started = launch(smol, kind="cpu", host="127.0.0.1", port=8101, gpus=[], model_configs_dir="/etc/models")
    assert started.argv == [sys.executable, "-m", "oasst_cpu_backend"]
    assert started.env == {
        "OASST_CPU_BACKEND_HOST": "127.0.0.1",
        "OASST_CPU_BACKEND_PORT": "8101",
        "OASST_CPU_BACKEND_MODEL_CONFIG_NAME": "m",
        "OASST_CPU_BACKEND_MODEL_CONFIGS_DIR": "/etc/models",
    }
    on_gpus = launch(config(), kind="tgi", host="h", port=1, gpus=["2", "3"], command=["/opt/tgi/launcher"])
    assert on_gpus.env == {"CUDA_VISIBLE_DEVICES": "2,3"} and on_gpus.argv[0] == "/opt/tgi/launcher"


def test_gpu_groups() -> None:
    assert gpu_groups(["0", "1"], 1) == [["0"], ["1"]]
    assert gpu_groups(["0", "1", "2", "3"], 2) == [["0", "1"], ["2", "3"]]
    assert gpu_groups(["0", "1", "2"], 2) == [["0", "1"]]  # GPU 2 fills no group
    assert gpu_groups([], 1) == [[]]  # the environment's GPUs
    assert gpu_groups(["0", "1"], 0) == [[]]  # a model that needs none: one backend
    with pytest.raises(GpuAssignmentError, match="needs 4 GPUs"):
        gpu_groups(["0", "1"], 4)
    with pytest.raises(GpuAssignmentError, match="twice"):
        gpu_groups(["0", "0"], 1)
