"""The TGI adapter against the bundled CPU backend (which speaks TGI's API): generations share one pooled
connection, and a stream left early closes its own so that the backend stops generating."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import aclosing
from pathlib import Path
from urllib.parse import urlparse

import pytest

from oasst_shared.sampling import SamplingParameters
from oasst_worker.backends.records import GenerationResult, StreamedToken
from oasst_worker.backends.tgi import TgiBackend
from tests.support.stacks import BackendProcess

GREEDY = SamplingParameters(do_sample=False)
PROMPT = "<|im_start|>user\nCount from one to ten.<|im_end|>\n<|im_start|>assistant\n"


def client_ports(backend_url: str) -> set[int]:
    """Local ports of this machine's established TCP connections to the backend's port."""
    port = urlparse(backend_url).port
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        path = Path(table)
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            local, remote, state = fields[1], fields[2], fields[3]
            if state == "01" and int(remote.rsplit(":", 1)[1], 16) == port:
                ports.add(int(local.rsplit(":", 1)[1], 16))
    return ports


@pytest.fixture
async def backend(cpu_backend: BackendProcess) -> AsyncIterator[TgiBackend]:
    adapter = TgiBackend(cpu_backend.url, token_timeout=60.0, generation_timeout=300.0)
    yield adapter
    await adapter.close()


async def generate(backend: TgiBackend, max_new_tokens: int) -> tuple[list[str], GenerationResult | None]:
    texts: list[str] = []
    async with aclosing(backend.generate_stream(PROMPT, GREEDY, max_new_tokens)) as stream:
        async for item in stream:
            if isinstance(item, StreamedToken):
                texts.append(item.text)
            else:
                return texts, item
    return texts, None


async def test_generations_reuse_one_connection_to_the_backend(
    backend: TgiBackend, cpu_backend: BackendProcess
) -> None:
    before = client_ports(cpu_backend.url)
    texts, result = await generate(backend, 4)
    assert result is not None and result.generated_tokens == 4 and len(texts) == 4
    first = client_ports(cpu_backend.url) - before
    assert len(first) == 1  # kept alive after the stream was read to its end
    for _ in range(3):
        texts, result = await generate(backend, 4)
        assert result is not None and result.finish_reason == "length"
    assert client_ports(cpu_backend.url) - before == first


async def test_a_stream_left_early_closes_its_connection(
    backend: TgiBackend, cpu_backend: BackendProcess
) -> None:
    before = client_ports(cpu_backend.url)
    await generate(backend, 2)
    pooled = client_ports(cpu_backend.url) - before
    async with aclosing(backend.generate_stream(PROMPT, GREEDY, 200)) as stream:
        async for item in stream:
            assert isinstance(item, StreamedToken)
            break  # a cancel: the job leaves the stream after its first token
    for _ in range(200):  # the transport closes on the event loop's next turns
        if not client_ports(cpu_backend.url) & pooled:
            break
        await asyncio.sleep(0.01)
    assert not (client_ports(cpu_backend.url) & pooled)  # the stream's connection is gone
    texts, result = await generate(backend, 2)
    assert result is not None and len(texts) == 2  # the next generation opens another
