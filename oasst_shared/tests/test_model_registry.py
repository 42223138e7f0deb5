"""The model registry: configs from files merged over the built-ins, errors that name the file and field,
and configs completed from the model's own files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from oasst_shared.model_configs import MODEL_CONFIGS, SMOLLM2_135M, SMOLLM2_135M_Q8, ModelConfig
from oasst_shared.model_files import ModelFacts, hf_folder_of, read_hf_folder, with_model_facts
from oasst_shared.model_registry import BUILT_IN, ModelRegistryError, load_registry


def write(directory: Path, name: str, text: str) -> Path:
    path = directory / name
    path.write_text(text)
    return path


def test_no_directory_is_the_builtins() -> None:
    registry = load_registry(None)
    assert dict(registry) == MODEL_CONFIGS
    assert registry.source(SMOLLM2_135M.name) == BUILT_IN


def test_yaml_and_json_files_one_config_or_a_list(tmp_path: Path) -> None:
    write(
        tmp_path,
        "q4.yaml",
        "name: smol-q4\nmodel_id: HuggingFaceTB/SmolLM2-135M-Instruct\nbackend: cpu\nquantization: q4_0\n",
    )
    write(
        tmp_path,
        "fleet.json",
        json.dumps(
            [
                {
                    "name": "llama-awq",
                    "model_id": "org/llama-awq",
                    "quantization": "awq",
                    "gpus_per_replica": 2,
                },
                {
                    "name": "qwen",
                    "model_id": "Qwen/Qwen2.5-7B-Instruct",
                    "backend": "vllm",
                    "dtype": "bfloat16",
                },
            ]
        ),
    )
    write(tmp_path, "notes.txt", "not a config")
    write(tmp_path, ".hidden.yaml", "this: is: not: parsed")
    registry = load_registry(tmp_path)
    assert set(registry) == set(MODEL_CONFIGS) | {"smol-q4", "llama-awq", "qwen"}
    assert registry["smol-q4"].quantization == "q4_0"
    assert registry["llama-awq"].backend == "tgi"  # the default backend of a generation model
    assert registry["llama-awq"].gpus_per_replica == 2
    assert registry["qwen"].gpus_per_replica == 1  # the default of a GPU backend
    assert registry.source("qwen") == str(tmp_path / "fleet.json")


def test_a_file_replaces_a_builtin_of_the_same_name(tmp_path: Path) -> None:
    write(
        tmp_path,
        "smol.yaml",
        f"name: {SMOLLM2_135M.name}\nmodel_id: {SMOLLM2_135M.model_id}\nbackend: cpu\nmax_total_length: 4096\n",
    )
    registry = load_registry(tmp_path)
    assert registry[SMOLLM2_135M.name].max_total_length == 4096
    # The input length follows the total length it was not given with.
    assert registry[SMOLLM2_135M.name].max_input_length == 3072
    assert registry.source(SMOLLM2_135M.name).endswith("smol.yaml")


def test_errors_name_the_file_the_entry_and_the_field(tmp_path: Path) -> None:
    write(tmp_path, "a-bad-quant.yaml", "name: smol-q8\nmodel_id: m\nbackend: cpu\nquantization: q9_9\n")
    write(
        tmp_path,
        "b-list.yaml",
        "- name: ok\n  model_id: m\n- name: typo\n  model_id: m\n  quantisation: awq\n- just a string\n",
    )
    write(tmp_path, "c-broken.yaml", "name: [unclosed\n")
    write(
        tmp_path,
        "d-wrong-backend.yaml",
        "name: gguf-on-tgi\nmodel_id: m\nbackend: tgi\nquantization: q4_k_m\n",
    )
    write(tmp_path, "e-dupe.json", json.dumps({"name": "ok", "model_id": "other"}))
    with pytest.raises(ModelRegistryError) as caught:
        load_registry(tmp_path)
    problems = caught.value.problems
    text = str(caught.value)
    assert f"{tmp_path / 'a-bad-quant.yaml'}: quantization: Input should be" in text
    assert (
        f"{tmp_path / 'b-list.yaml'}: [1] (name 'typo'): quantisation: unknown field (did you mean 'quantization'?)"
        in problems
    )
    assert f"{tmp_path / 'b-list.yaml'}: [2]: expected a mapping of fields" in problems
    assert any(p.startswith(f"{tmp_path / 'c-broken.yaml'}: cannot be read: line 2") for p in problems)
    assert any(
        p.startswith(
            f"{tmp_path / 'd-wrong-backend.yaml'}: quantization 'q4_k_m' is not one backend 'tgi' applies"
        )
        for p in problems
    )
    assert f"{tmp_path / 'e-dupe.json'}: name: 'ok' is also defined in {tmp_path / 'b-list.yaml'}" in problems
    assert len(problems) == 6


def test_a_relative_model_path_is_relative_to_its_file(tmp_path: Path) -> None:
    (tmp_path / "configs").mkdir()
    write(
        tmp_path / "configs", "m.yaml", "name: m\nmodel_id: m\nbackend: cpu\nmodel_path: ../weights/m.gguf\n"
    )
    registry = load_registry(tmp_path / "configs")
    assert registry["m"].model_path == str(tmp_path / "weights" / "m.gguf")


def test_a_missing_directory_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ModelRegistryError, match="not a directory"):
        load_registry(tmp_path / "nowhere")


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"backend": "tgi", "quantization": "q4_0"}, "is not one backend 'tgi' applies"),
        ({"backend": "vllm", "quantization": "eetq"}, "is not one backend 'vllm' applies"),
        ({"backend": "cpu", "quantization": "awq"}, "is not one backend 'cpu' applies"),
        ({"backend": "tgi", "dtype": "float32"}, "dtype 'float32' is not one backend 'tgi' takes"),
        (
            {"backend": "tgi", "dtype": "float16", "quantization": "awq"},
            "dtype only with quantization 'none'",
        ),
        ({"backend": "cpu", "backend_args": ["--x"]}, "OASST_CPU_BACKEND_"),
        ({"backend": "openai", "backend_args": ["--x"]}, "takes no backend_args"),
        ({"backend": "cpu", "gpus_per_replica": 1}, "uses no GPU"),
        ({"backend": "embedding"}, "a generation model cannot have backend 'embedding'"),
        ({"backend": "tgi", "backend_args": ["x" * 1025]}, "longer than 1024"),
    ],
)
def test_each_backend_takes_only_what_it_applies(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        ModelConfig.model_validate({"name": "m", "model_id": "m", **fields})


def test_a_config_from_a_worker_older_than_the_backend_field_is_accepted() -> None:
    # The built-in SmolLM2 as a worker of the previous release announced it: a Q4_1 label, no backend.
    old = {"name": "SmolLM2-135M-Instruct", "model_id": "m", "quantization": "q4_1", "max_input_length": 1536}
    assert ModelConfig.model_validate(old).backend == "cpu"
    assert ModelConfig.model_validate({"name": "m", "model_id": "m", "quantization": "int8"}).backend == "tgi"


def test_labels_pass_for_servers_the_operator_runs() -> None:
    config = ModelConfig(name="m", model_id="m", backend="openai", quantization="q4_k_m", dtype="float32")
    assert config.quantization == "q4_k_m"


def test_the_second_builtin_is_smollm2_as_q8_0_on_the_cpu_backend() -> None:
    assert SMOLLM2_135M_Q8.backend == "cpu"
    assert SMOLLM2_135M_Q8.quantization == "q8_0"
    assert SMOLLM2_135M_Q8.model_id == SMOLLM2_135M.model_id
    assert SMOLLM2_135M_Q8.max_total_length == SMOLLM2_135M.max_total_length


def test_the_model_files_fill_what_the_config_leaves_out() -> None:
    config = ModelConfig(name="m", model_id="m", backend="vllm", eos_token="<mine>")
    facts = ModelFacts(
        context_length=8192,
        chat_template="{{ messages }}",
        bos_token="<s>",
        eos_token="</s>",
        dtype="bfloat16",
    )
    resolved = with_model_facts(config, facts)
    assert resolved.max_total_length == 8192
    assert resolved.max_input_length == 6144
    assert resolved.chat_template_source == "inline"
    assert resolved.chat_template == "{{ messages }}"
    assert resolved.bos_token == "<s>"
    assert resolved.eos_token == "<mine>"  # set by the config: the config wins
    assert resolved.dtype == "bfloat16"
    # What was filled stays open to a later source (the running backend's report).
    again = with_model_facts(resolved, ModelFacts(context_length=4096, max_input_length=4095))
    assert (again.max_total_length, again.max_input_length) == (4096, 3072)
    # A backend's input limit below the usual share bounds the prompt.
    small = with_model_facts(resolved, ModelFacts(context_length=4096, max_input_length=1000))
    assert small.max_input_length == 1000


def test_the_config_wins_over_the_model_files() -> None:
    config = ModelConfig(
        name="m", model_id="m", max_total_length=2048, chat_template_source="chatml", quantization="awq"
    )
    resolved = with_model_facts(
        config, ModelFacts(context_length=32768, chat_template="{{ x }}", quantization="gptq")
    )
    assert (resolved.max_total_length, resolved.max_input_length) == (2048, 1536)
    assert resolved.chat_template_source == "chatml"
    assert resolved.quantization == "awq"


def test_a_hugging_face_folder(tmp_path: Path) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(
        json.dumps(
            {
                "max_position_embeddings": 32768,
                "torch_dtype": "bfloat16",
                "quantization_config": {"quant_method": "awq", "bits": 4},
            }
        )
    )
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "chat_template": [
                    {"name": "default", "template": "{{ default }}"},
                    {"name": "tool_use", "template": "t"},
                ],
                "bos_token": None,
                "eos_token": {"content": "<|im_end|>", "lstrip": False},
            }
        )
    )
    facts = read_hf_folder(folder)
    assert facts == ModelFacts(
        context_length=32768,
        chat_template="{{ default }}",
        bos_token=None,
        eos_token="<|im_end|>",
        dtype="bfloat16",
        quantization="awq",
    )
    config = ModelConfig(name="m", model_id="org/m", model_path=str(folder), backend="tgi")
    assert hf_folder_of(config) == folder
    assert hf_folder_of(ModelConfig(name="m", model_id="org/m")) is None
    resolved = with_model_facts(config, facts)
    assert resolved.quantization == "awq"
    assert resolved.dtype == "auto"  # a quantized model's dtype is left to the backend
    assert resolved.max_total_length == 32768
