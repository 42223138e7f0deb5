"""Generate the references in docs/ from the code, so that they cannot drift from it.

    python scripts/gen_docs.py           # (re)write docs/protocol.md and docs/configuration.md
    python scripts/gen_docs.py --check   # exit 1 and name the stale files, writing nothing

``docs/protocol.md`` comes from the pydantic schemas in ``oasst_shared/oasst_shared/protocol.py``;
``docs/configuration.md`` from the settings classes of the server, the worker and the CPU backend.
Descriptions come from the code (``Field(description=...)``, which the OpenAPI document shows too, else
the comment above or beside the field, else the class docstring); a field without one is an error. The
few texts the code cannot hold (frame summaries, close codes, machine-dependent defaults) are in the
tables below, and an entry there that names nothing that exists is an error, so they cannot rot either.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import io
import json
import re
import sys
import textwrap
import tokenize
import types
import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

ROOT = Path(__file__).resolve().parent.parent
PROTOCOL_DOC = ROOT / "docs" / "protocol.md"
CONFIGURATION_DOC = ROOT / "docs" / "configuration.md"


# ---------------------------------------------------------------- what the code cannot say
# Field descriptions live on the fields (Field(description=...)); these are the frames' summaries, the
# close codes and the defaults that depend on the machine.

FRAME_NOTES: dict[str, str] = {
    "Pong": "The answer to a `ping`, with the worker's current capacity. Pongs also extend the leases "
    "of the messages the worker holds.",
    "Token": "One streamed piece of an answer.",
    "TokenBatch": "Several `token` frames in one (protocol 2): a worker sends one when tokens queue up "
    "faster than it writes frames, so under load it costs both sides a frame and a parse per batch "
    "instead of per token. The server handles it exactly as the same tokens sent one frame each.",
    "GeneratedText": "A generation finished (or was cancelled): the whole text and its token counts.",
    "Cancel": "Stop generating this message.",
    "Ping": "Are you alive, and how much can you take? Sent every `OASST_SERVER_WORKER_PING_INTERVAL` "
    "seconds; a worker silent past `OASST_SERVER_WORKER_PING_TIMEOUT` is disconnected and loses its work.",
}

CLOSE_CODES: dict[str, str] = {
    "CLOSE_POLICY_VIOLATION": "A malformed or unexpected frame, or no valid `worker_info` first frame within "
    "`OASST_SERVER_WORKER_HELLO_TIMEOUT`. The messages the connection held are retried elsewhere; the "
    "server and its other workers are unaffected.",
    "CLOSE_GOING_AWAY": "The server ended the connection: the worker stopped answering pings, or the "
    "socket broke. Its messages are retried elsewhere; the worker reconnects with backoff.",
    "CLOSE_UNSUPPORTED_PROTOCOL": "Sent after `upgrade_required`: the worker's `X-Protocol-Version` is "
    "outside what the server speaks. The worker exits instead of reconnecting.",
    "CLOSE_UNAUTHORIZED": "The worker's API key was replaced or deleted through the admin API (every "
    "replica closes that key's sockets at once). A bad key at connect time is refused before the "
    "websocket upgrade, with HTTP 403, and the worker exits.",
    "CLOSE_UNSUPPORTED_DATA": "A binary frame: the protocol is JSON text frames only.",
    "CLOSE_MESSAGE_TOO_BIG": "A frame over `MAX_FRAME_BYTES` (1 MiB), the limit both ends keep. A worker "
    "never sends one: a result that would be larger becomes an `error` for its message.",
    "CLOSE_INTERNAL_ERROR": "A server bug ended this connection (logged); its messages are retried elsewhere.",
    "CLOSE_TRY_AGAIN_LATER": "The server cannot check a registered worker key right now (its database is "
    "briefly down); the worker reconnects with backoff.",
    "CLOSE_KEY_FORBIDS": "The worker announced more than its API key allows: a model config the key does "
    "not name, more slots than the key's `max_slots` (or `OASST_SERVER_MAX_SLOTS_PER_WORKER`), or a socket "
    "past the key's `max_sockets`. The reason says which; the worker logs it and exits.",
}

# Defaults computed from the machine: the doc says how, not what this machine gave.
MACHINE_DEFAULTS: dict[str, str] = {
    "oasst_cpu_backend.settings:Settings.n_threads": "CPU count - 1 (at least 1)",
}


@dataclass(frozen=True)
class Component:
    title: str
    module: str
    class_name: str
    command: str

    @property
    def key(self) -> str:
        return f"{self.module}:{self.class_name}"

    def load(self) -> type[BaseModel]:
        cls = getattr(importlib.import_module(self.module), self.class_name)
        assert isinstance(cls, type) and issubclass(cls, BaseModel)
        return cls


COMPONENTS = (
    Component("Server", "oasst_inference_server.settings", "Settings", "oasst-server"),
    Component("Worker", "oasst_worker.settings", "WorkerSettings", "oasst-worker"),
    Component("CPU backend", "oasst_cpu_backend.settings", "Settings", "oasst-cpu-backend"),
)


# ---------------------------------------------------------------- reading the code


def source_comments(cls: type) -> dict[str, str]:
    """The comment above each annotated attribute of ``cls`` (or on its line), joined into one text."""
    try:
        lines, _ = inspect.getsourcelines(cls)
    except (OSError, TypeError):
        return {}
    source = textwrap.dedent("".join(lines))
    src_lines = source.splitlines()
    inline: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT and src_lines[tok.start[0] - 1].strip() != tok.string.strip():
            inline[tok.start[0]] = tok.string.lstrip("#").strip()
    comments: dict[str, str] = {}
    class_node = ast.parse(source).body[0]
    assert isinstance(class_node, ast.ClassDef)
    for node in class_node.body:
        if not isinstance(node, ast.AnnAssign) or not isinstance(node.target, ast.Name):
            continue
        above: list[str] = []
        index = node.lineno - 2
        while index >= 0 and src_lines[index].strip().startswith("#"):
            line = src_lines[index].strip().lstrip("#").strip()
            if line.startswith("---"):
                break  # a section heading, not this field's description
            above.insert(0, line)
            index -= 1
        text = " ".join(above)
        if node.lineno in inline and not inline[node.lineno].startswith(("noqa", "type:")):
            text = f"{text} {inline[node.lineno]}".strip()
        if text:
            comments[node.target.id] = text
    return comments


def rst_to_markdown(text: str) -> str:
    text = re.sub(r":(?:class|data|func|meth|attr):`~?([^`]+)`", r"`\1`", text)
    return text.replace("``", "`")


def class_doc(cls: type) -> str:
    doc = vars(cls).get("__doc__")
    return rst_to_markdown(inspect.cleandoc(doc)) if doc else ""


def field_name(name: str, info: FieldInfo) -> str:
    return info.alias or name


def description(cls: type, name: str, info: FieldInfo) -> str:
    if info.description:
        return rst_to_markdown(info.description)
    # The comment is in the class that declares the field (a settings class may gather groups of them).
    owner = next((c for c in cls.__mro__ if name in vars(c).get("__annotations__", {})), cls)
    return rst_to_markdown(source_comments(owner).get(name, ""))


# ---------------------------------------------------------------- rendering values and types


def cell(text: str) -> str:
    """Text safe inside a markdown table cell."""
    return " ".join(text.split()).replace("|", "\\|")


def render_type(annotation: Any, link: Callable[[type[BaseModel]], str], aliases: dict[tuple, str]) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if annotation is type(None):
        return "null"
    if origin is typing.Annotated:
        return render_type(args[0], link, aliases)
    if origin is typing.Literal:
        if args in aliases:
            return aliases[args]
        return " | ".join(json.dumps(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(render_type(a, link, aliases) for a in args)
    if origin in (list, tuple, set, frozenset, dict):
        inner = ", ".join(render_type(a, link, aliases) for a in args)
        return f"{origin.__name__}[{inner}]"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return link(annotation)
    if isinstance(annotation, type):
        return annotation.__name__
    return str(annotation).replace("typing.", "")


def render_constraints(info: FieldInfo) -> str:
    parts: list[str] = []
    for meta in info.metadata:
        if isinstance(meta, annotated_types.Ge):
            parts.append(f"≥ {meta.ge}")
        elif isinstance(meta, annotated_types.Gt):
            parts.append(f"> {meta.gt}")
        elif isinstance(meta, annotated_types.Le):
            parts.append(f"≤ {meta.le}")
        elif isinstance(meta, annotated_types.Lt):
            parts.append(f"< {meta.lt}")
        elif isinstance(meta, annotated_types.MinLen):
            parts.append(f"at least {meta.min_length} long")
        elif isinstance(meta, annotated_types.MaxLen):
            parts.append(f"at most {meta.max_length} long")
        elif getattr(meta, "pattern", None):
            parts.append(f"matches `{meta.pattern}`")
    return ", ".join(parts)


def render_default(info: FieldInfo, key: str) -> str:
    if key in MACHINE_DEFAULTS:
        return MACHINE_DEFAULTS[key]
    if info.is_required():
        return "required"
    value = info.default_factory() if info.default_factory is not None else info.default  # type: ignore[call-arg]
    if value is PydanticUndefined:
        return "required"
    if isinstance(value, BaseModel):
        dumped = value.model_dump(mode="json", exclude_defaults=True)
        return f"`{json.dumps(dumped)}`" if dumped else "all defaults"
    if isinstance(value, Path):
        value = str(value)
    return f"`{json.dumps(value)}`"


# ---------------------------------------------------------------- docs/protocol.md


def _union_members(union: Any) -> list[type[BaseModel]]:
    inner = typing.get_args(union)[0] if typing.get_origin(union) is typing.Annotated else union
    return list(typing.get_args(inner))


def _literal_aliases(module: types.ModuleType) -> dict[tuple, str]:
    return {
        typing.get_args(value): name
        for name, value in vars(module).items()
        if typing.get_origin(value) is typing.Literal and not name.startswith("_")
    }


def _anchor(name: str) -> str:
    return name.lower()


def _nested_models(roots: Iterable[type[BaseModel]]) -> list[type[BaseModel]]:
    seen: list[type[BaseModel]] = []

    def walk(annotation: Any) -> None:
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            if annotation not in seen:
                seen.append(annotation)
                for info in annotation.model_fields.values():
                    walk(info.annotation)
            return
        for arg in typing.get_args(annotation):
            walk(arg)

    for root in roots:
        for info in root.model_fields.values():
            walk(info.annotation)
    return seen


def protocol_examples(p: types.ModuleType) -> dict[str, BaseModel]:
    """One valid instance of every frame; validated, so a renamed field breaks generation."""
    from oasst_shared.model_configs import ModelConfig
    from oasst_shared.sampling import SamplingParameters

    model = ModelConfig(
        name="SmolLM2-135M-Instruct",
        model_id="HuggingFaceTB/SmolLM2-135M-Instruct",
        max_input_length=1536,
        max_total_length=2048,
        stop_sequences=["<|im_end|>"],
    )
    mid = "01JBX7Q2W8M5R3K9T6V4Y1Z0AB"
    return {
        "WorkerInfo": p.WorkerInfo(
            model_config=model,
            max_parallel_requests=2,
            backend_kind="tgi",
            worker_version="0.1.0",
            hardware=p.Hardware(cpu_count=8),
        ),
        "Pong": p.Pong(ping_id="3f9c1a2b7d4e", free_slots=1),
        "Token": p.Token(message_id=mid, text=" Paris"),
        "TokenBatch": p.TokenBatch(
            tokens=[p.Token(message_id=mid, text=" Par"), p.Token(message_id=mid, text="is")]
        ),
        "GeneratedText": p.GeneratedText(
            message_id=mid,
            text="The capital of France is Paris.",
            finish_reason="eos_token",
            generated_tokens=8,
            prompt_tokens=31,
        ),
        "Embeddings": p.Embeddings(message_id=mid, embeddings=[[0.12, -0.03, 0.4]], prompt_tokens=5),
        "EmbeddingsPart": p.EmbeddingsPart(message_id=mid, start=0, embeddings=[[0.08, 0.31, -0.2]]),
        "WorkerError": p.WorkerError(message_id=mid, error="backend connection failed", retryable=True),
        "Drain": p.Drain(),
        "Work": p.Work(
            message_id=mid,
            chat_id="01JBX7PZ3M0E2N6Q8R1S4T7U9V",
            model_config_name="SmolLM2-135M-Instruct",
            thread=[p.ChatTurn(role="user", content="What is the capital of France?")],
            sampling_parameters=SamplingParameters(temperature=0.7, top_p=0.95, max_new_tokens=256),
        ),
        "EmbedWork": p.EmbedWork(message_id=mid, model_config_name="all-MiniLM-L6-v2", inputs=["hello"]),
        "Cancel": p.Cancel(message_id=mid),
        "Ping": p.Ping(ping_id="3f9c1a2b7d4e"),
        "Tokenized": p.Tokenized(request_id="q-5d1e0c9a7b3f4e2d8c6a", counts=[2706], prompt_bytes=[12180]),
        "Detokenized": p.Detokenized(request_id="q-8e2f1a0b9c4d3e7f6a5b", texts=[" Paris"]),
        "Tokenize": p.Tokenize(
            request_id="q-5d1e0c9a7b3f4e2d8c6a",
            inputs=[
                p.TokenizeInput(
                    conversation=p.PromptConversation(
                        thread=[p.ChatTurn(role="user", content="What is the capital of France?")],
                        system_prompt="Answer in one word.",
                    )
                )
            ],
        ),
        "Detokenize": p.Detokenize(request_id="q-8e2f1a0b9c4d3e7f6a5b", token_ids=[[7042]]),
        "ModelSwitch": p.ModelSwitch(
            request_id="sw-2c7e9a1f4b6d8e0a3c5f",
            model_config_name="SmolLM2-135M-Instruct-Q8_0",
            step="quantizing",
            tensors_done=112,
            tensors_total=272,
        ),
        "LoadModel": p.LoadModel(
            request_id="sw-2c7e9a1f4b6d8e0a3c5f", model_config_name="SmolLM2-135M-Instruct-Q8_0"
        ),
        "UnloadModel": p.UnloadModel(request_id="sw-9a0b1c2d3e4f5a6b7c8d"),
        "UpgradeRequired": p.UpgradeRequired(
            server_protocol_version=p.PROTOCOL_VERSION,
            min_supported_version=p.MIN_SUPPORTED_PROTOCOL_VERSION,
            detail="this server speaks worker protocol 1..2, the worker sent 0: upgrade the worker",
        ),
    }


def render_protocol() -> str:
    p = importlib.import_module("oasst_shared.protocol")
    worker_frames = _union_members(p.WorkerFrame)
    server_frames = _union_members(p.ServerFrame)
    frames = [(f, "worker → server") for f in worker_frames] + [(f, "server → worker") for f in server_frames]
    frame_names = {f.__name__ for f, _ in frames}
    nested = [m for m in _nested_models(f for f, _ in frames) if m.__name__ not in frame_names]
    aliases = _literal_aliases(p)
    close_constants = {n: v for n, v in vars(p).items() if n.startswith("CLOSE_")}
    examples = protocol_examples(p)

    def link(model: type[BaseModel]) -> str:
        if model.__name__ in frame_names:
            return f"[{model.__name__}](#{_anchor(model.model_fields['type'].default)})"
        return f"[{model.__name__}](#{_anchor(model.__name__)})"

    alias_links = {args: f"[{name}](#{_anchor(name)})" for args, name in aliases.items()}
    out: list[str] = []
    w = out.append
    w("# Worker protocol reference")
    w("")
    w("<!-- Generated by scripts/gen_docs.py from oasst_shared/oasst_shared/protocol.py: do not edit by")
    w("     hand; change the schemas and run `make docs`. tests/ops/test_generated_docs.py checks it. -->")
    w("")
    w(
        "Workers connect to the server over one websocket each and exchange JSON frames. Every frame is one "
        "JSON object with a `type` field; each side parses it with a pydantic discriminated union "
        "(`WorkerFrame`, `ServerFrame` in `oasst_shared.protocol`), so a frame is parsed and validated in one "
        "step. Unknown fields are refused."
    )
    w("")
    w(
        f"Protocol version: **{p.PROTOCOL_VERSION}**; the server accepts workers speaking versions "
        f"{p.MIN_SUPPORTED_PROTOCOL_VERSION} to {p.PROTOCOL_VERSION}. Bump `PROTOCOL_VERSION` on any change "
        "an older peer would misread."
    )
    w("")
    w("## Handshake")
    w("")
    w("1. The worker opens `ws(s)://SERVER/workers/work` with two headers:")
    w("")
    w("   | header | value |")
    w("   |---|---|")
    w(f"   | `{p.API_KEY_HEADER}` | one of the server's `OASST_SERVER_WORKER_API_KEYS` |")
    w(f"   | `{p.PROTOCOL_VERSION_HEADER}` | the worker's protocol version (`{p.PROTOCOL_VERSION}`) |")
    w("")
    w("2. A missing or wrong API key is refused before the upgrade: HTTP 403. The worker exits.")
    w(
        f"3. A protocol version outside {p.MIN_SUPPORTED_PROTOCOL_VERSION}..{p.PROTOCOL_VERSION}: the server "
        f"accepts, sends one [`upgrade_required`](#upgrade_required) frame and closes with "
        f"`{p.CLOSE_UNSUPPORTED_PROTOCOL}`. The worker exits."
    )
    w(
        "4. The worker's first frame must be [`worker_info`](#worker_info), within "
        f"`OASST_SERVER_WORKER_HELLO_TIMEOUT`; anything else closes with `{p.CLOSE_POLICY_VIOLATION}`."
    )
    w(
        "5. Then, until either side closes: the server sends `ping` regularly and `work` (or `embed`) while "
        "the worker has a free slot, and relays `cancel` from any replica; the worker answers every `ping` "
        "with a `pong`, streams `token` (or, protocol 2, `token_batch`) frames and ends each job with exactly one `generated_text`, "
        "`embeddings` or `error` (protocol 4: an embedding result too large for one frame comes as "
        "`embeddings_part` frames before its `embeddings`). On SIGTERM the worker sends `drain`, finishes its "
        "jobs and closes."
    )
    w("")
    w("```mermaid")
    w("sequenceDiagram")
    w("    participant W as worker")
    w("    participant S as server")
    w(f"    W->>S: GET /workers/work (Upgrade)<br/>{p.API_KEY_HEADER}, {p.PROTOCOL_VERSION_HEADER}")
    w("    S-->>W: 101 Switching Protocols")
    w("    W->>S: worker_info")
    w("    S->>W: ping")
    w("    W->>S: pong {free_slots}")
    w("    S->>W: work")
    w("    W->>S: token, token, ...")
    w("    W->>S: generated_text")
    w("```")
    w("")
    w("## Limits and refused frames")
    w("")
    w(
        f"- **Frame size.** No frame in either direction is larger than `MAX_FRAME_BYTES` "
        f"({p.MAX_FRAME_BYTES} bytes, UTF-8), the websockets `max_size` of both ends. The server never sends "
        f"a larger `work`: a request whose work would not fit is refused when it is submitted (413), and a "
        f"stored message that would not fit fails alone, with that error, before any worker sees it. The "
        f"worker never sends a larger frame: a token batch is split, an embedding result is sent in parts "
        f"(protocol 4: `embeddings_part` frames, each cut by the most bytes a float takes, then `embeddings` "
        f"with the last vectors), and any other result that would not fit becomes a final `error` for its "
        f"message. A frame over the limit that arrives anyway closes the socket with "
        f"`{p.CLOSE_MESSAGE_TOO_BIG}`."
    )
    w(
        "- **Embedding parts.** The server keeps the parts of a result only while its job is in flight, "
        "in order (each part's `start` is the number of vectors before it), and never more than the job "
        "asked for: one vector per input, all of one dimension (at most `MAX_EMBEDDING_DIMENSION`, "
        f"{p.MAX_EMBEDDING_DIMENSION}). A part out of order, a vector too many or of another dimension, "
        "or a final frame that leaves the result short, fails that job alone."
    )
    w(
        "- **Work the worker cannot read.** A server frame that fails the worker's validation (a schema "
        "nested deeper than its JSON parser goes, a field it does not know) but names a job (`work` or "
        "`embed` with a `message_id`, found without parsing the rest) is answered with a final `error` for "
        "that message, never dropped; the server fails that message alone."
    )
    w(
        "- **A backend that dies.** When the connection to its backend breaks mid-request and the backend's "
        "health check then fails, the worker reports the job's `error` with `backend_died` (protocol 4) and "
        "takes no work until the backend is healthy again. The server counts the deaths per message: at "
        "`OASST_SERVER_MAX_BACKEND_DEATHS` the message fails instead of going to another backend (a "
        "message that crashes backends is not sent to one after another); below it, it is retried as any "
        "failure is."
    )
    w(
        "- **Continuation** (protocol 5). When a worker is lost after its answer's text was streamed "
        "(its socket closed, its lease or in-progress bound ran out, its backend failed or died), the "
        "server keeps that text and sends the message, with `answer_prefix` set to it, to the next "
        "worker whose capabilities say `continue_answer`. That worker renders the prompt as for the first "
        "try, puts the prefix right after it (no end-of-turn), counts the prefix against the input limit "
        "and against `max_new_tokens`, generates what follows, and streams and returns only that part, "
        "with `generated_text.prefix_tokens`; the server stores the prefix and that part as one answer. "
        f"A TGI-style backend is told where the prefix starts (the `{p.ANSWER_START_HEADER}` header, a "
        "character index into `inputs`): the bundled CPU backend then evaluates the prefix's tokens one a "
        "step, as it generated them, so a greedy answer continues exactly. A worker that cannot continue "
        "(a backend that takes chat messages) gets the message without the prefix and starts it over "
        "(readers get a `retry` event). See docs/failure-semantics.md for which cases continue."
    )
    w(
        "- **Encoding.** Every frame is one websocket text frame holding one JSON object, UTF-8; the field "
        "order and spacing do not matter. The reference worker and server write and read the hot frames, "
        "`token` and `token_batch`, with msgspec (`oasst_shared/token_frames.py`) to exactly the JSON these "
        "schemas define, and check them against the same bounds; any other JSON writer (older workers "
        "used pydantic) is read alike."
    )
    w(
        "- **Text.** Every text a frame carries (`token.text`, `generated_text.text`, `error.error`, the "
        "turns, system prompt and raw prompt of `work`, the inputs of `embed`) holds no NUL character and "
        "no lone surrogate. The worker turns backend output that breaks this into a final `error` for its "
        "message; the server refuses a `work` it cannot send (the message fails alone)."
    )
    w(
        "- **A refused frame hurts only the messages it names.** A worker frame that fails validation but "
        "names messages this connection holds (a `message_id`, or the tokens of a `token_batch`) fails "
        "those messages, as a final error; the valid tokens of a batch are still relayed. Only a frame that "
        f"names no message (not JSON, no known type) closes the socket with `{p.CLOSE_POLICY_VIOLATION}`; "
        f"a binary frame closes it with `{p.CLOSE_UNSUPPORTED_DATA}`."
    )
    w(
        "- **What a key allows.** A worker key created through the admin API may name the model configs it "
        "serves (`allowed_models`), the most slots one socket announces (`max_slots`) and the most sockets "
        "open at once on all replicas (`max_sockets`); every key is capped at "
        "`OASST_SERVER_MAX_SLOTS_PER_WORKER` slots. A `worker_info` announcing more is refused with "
        f"`{p.CLOSE_KEY_FORBIDS}` and a reason; the worker logs it and exits. Replacing or deleting a key, "
        f"or changing its limits, closes its sockets on every replica (`{p.CLOSE_UNAUTHORIZED}`)."
    )
    w(
        "- **Usage counts.** The server stores `generated_tokens` no larger than the message's "
        "`max_new_tokens` and than the bytes of text it saw streamed (plus a small slack), and "
        "`prompt_tokens` no larger than what the text it sent could hold."
    )
    w(
        "- **Questions to a worker** (protocol 4). The server may ask a worker that reported the "
        "`tokenize` capability to count or tokenize texts and conversations (`tokenize`) or to turn token "
        f"ids into text (`detokenize`), at most {p.MAX_TOKENIZE_INPUTS} inputs a frame; the worker answers "
        "each with one `tokenized` or `detokenized` frame naming its `request_id`, in any order and between "
        "any other frames, with `error` set when it cannot. The server waits a bounded time and does "
        "without an answer that does not come; an answer the protocol refuses fails only its question. "
        "The server asks no worker of protocol 3 or older."
    )
    w(
        "- **Time.** Every try of a message has an upper bound, "
        "`OASST_SERVER_IN_PROGRESS_GRACE + max_new_tokens / OASST_SERVER_MIN_GENERATION_RATE` seconds "
        "(an embedding counts one unit per input instead of `max_new_tokens`), pongs or not; past it the "
        "server sends `cancel` and retries the message elsewhere (or fails it)."
    )
    w("")
    w("## Close codes")
    w("")
    w("| code | constant | when |")
    w("|---|---|---|")
    for name, value in sorted(close_constants.items(), key=lambda kv: kv[1]):
        w(f"| `{value}` | `{name}` | {cell(CLOSE_CODES.get(name, ''))} |")
    w("")
    w("## Frames")
    w("")
    w("| type | direction | purpose |")
    w("|---|---|---|")
    for frame, direction in frames:
        ftype = frame.model_fields["type"].default
        summary = (class_doc(frame) or FRAME_NOTES.get(frame.__name__, "")).split("\n\n")[0]
        w(f"| [`{ftype}`](#{_anchor(ftype)}) | {direction} | {cell(summary)} |")
    w("")
    for frame, direction in frames:
        ftype = frame.model_fields["type"].default
        w(f"### {ftype}")
        w("")
        w(f"{direction}; `{frame.__name__}` in `oasst_shared.protocol`.")
        w("")
        doc = class_doc(frame) or FRAME_NOTES.get(frame.__name__, "")
        if doc:
            w(doc)
            w("")
        _field_table(w, frame, link, alias_links, skip={"type"})
        w("")
        w("```json")
        w(json.dumps(json.loads(p.dump_frame(examples[frame.__name__])), indent=2, ensure_ascii=False))
        w("```")
        w("")
    w("## Shared types")
    w("")
    for model in nested:
        w(f"### {model.__name__}")
        w("")
        w(f"`{model.__module__}.{model.__name__}`")
        w("")
        doc = class_doc(model)
        if doc:
            w(doc)
            w("")
        if model.model_config.get("extra") == "allow":
            w("Fields not listed here are accepted and kept.")
            w("")
        _field_table(w, model, link, alias_links, skip=set())
        w("")
    for args, name in aliases.items():
        w(f"### {name}")
        w("")
        w("One of: " + ", ".join(f"`{json.dumps(a)}`" for a in args) + ".")
        w("")
    return "\n".join(out).rstrip() + "\n"


def _field_table(
    w: Callable[[str], None],
    model: type[BaseModel],
    link: Callable[[type[BaseModel]], str],
    aliases: dict[tuple, str],
    skip: set[str],
) -> None:
    rows = [(n, i) for n, i in model.model_fields.items() if n not in skip]
    if not rows:
        w("No fields besides `type`.")
        return
    w("| field | type | default | constraints | description |")
    w("|---|---|---|---|---|")
    for name, info in rows:
        public = field_name(name, info)
        key = f"{model.__name__}.{public}"
        text = description(model, name, info)
        default = render_default(info, key)
        w(
            f"| `{public}` | {cell(render_type(info.annotation, link, aliases))} | {cell(default)} | "
            f"{cell(render_constraints(info))} | {cell(text)} |"
        )


# ---------------------------------------------------------------- docs/configuration.md


def env_names(cls: type[BaseModel]) -> dict[str, str]:
    """Field name -> the environment variable a pydantic-settings class reads it from."""
    prefix = str(cls.model_config.get("env_prefix", ""))
    names = {}
    for name, info in cls.model_fields.items():
        alias = info.validation_alias if isinstance(info.validation_alias, str) else info.alias
        names[name] = (alias or f"{prefix}{name}").upper()
    return names


def render_configuration() -> str:
    classes = [(c, c.load()) for c in COMPONENTS]
    out: list[str] = []
    w = out.append
    w("# Configuration reference")
    w("")
    w("<!-- Generated by scripts/gen_docs.py from the settings classes: do not edit by hand; change the")
    w("     settings and run `make docs`. tests/ops/test_generated_docs.py checks it. -->")
    w("")
    w(
        "Every component reads its settings from environment variables with its own prefix (names are "
        'case-insensitive). Lists and objects are given as JSON (`\'["a","b"]\'`); booleans as '
        "`true`/`false`; durations are in seconds unless the name says otherwise."
    )
    w("")
    w("| component | command | prefix | `.env` file | settings class |")
    w("|---|---|---|---|---|")
    for component, cls in classes:
        env_file = cls.model_config.get("env_file")
        path = Path(inspect.getfile(cls)).resolve().relative_to(ROOT)
        w(
            f"| [{component.title}](#{_anchor(component.title).replace(' ', '-')}) | `{component.command}` | "
            f"`{cls.model_config.get('env_prefix', '')}` | "
            f"{'read from the working directory' if env_file else 'no'} | "
            f"[`{component.class_name}`]({Path('..') / path}) |"
        )
    w("")
    w(
        "The text-client's variables (`OASST_SERVER_URL`, `OASST_USERNAME`, `OASST_MODEL`) are in "
        "[text-client.md](text-client.md); those of `full-dev-setup.sh` and of `docker-compose.yml` in "
        "[deploy.md](deploy.md)."
    )
    w("")
    for component, cls in classes:
        w(f"## {component.title}")
        w("")
        doc = class_doc(cls)
        if doc:
            w(doc)
            w("")
        w("| variable | type | default | allowed | description |")
        w("|---|---|---|---|---|")
        names = env_names(cls)
        for name, info in cls.model_fields.items():
            key = f"{component.key}.{name}"
            text = description(cls, name, info)
            w(
                f"| `{names[name]}` | {cell(render_type(info.annotation, lambda m: m.__name__, {}))} | "
                f"{cell(render_default(info, key))} | {cell(render_constraints(info))} | {cell(text)} |"
            )
        w("")
    return "\n".join(out).rstrip() + "\n"


def problems() -> list[str]:
    """What keeps the references from being complete: undocumented settings, fields and close codes,
    and entries of the tables above that name something that no longer exists."""
    found: list[str] = []
    p = importlib.import_module("oasst_shared.protocol")
    frames = _union_members(p.WorkerFrame) + _union_members(p.ServerFrame)
    models = frames + [m for m in _nested_models(frames) if m not in frames]
    for model in models:
        if model in frames and not (class_doc(model) or FRAME_NOTES.get(model.__name__)):
            found.append(f"frame {model.__name__} has no docstring (or FRAME_NOTES entry)")
        for name, info in model.model_fields.items():
            if name != "type" and not description(model, name, info):
                found.append(f"protocol field {model.__name__}.{field_name(name, info)} has no description")
    close_constants = {n for n in vars(p) if n.startswith("CLOSE_")}
    found += [f"close code {n} has no CLOSE_CODES entry" for n in sorted(close_constants - set(CLOSE_CODES))]
    settings_keys: set[str] = set()
    for component in COMPONENTS:
        cls = component.load()
        names = env_names(cls)
        for name, info in cls.model_fields.items():
            key = f"{component.key}.{name}"
            settings_keys.add(key)
            if not description(cls, name, info):
                found.append(f"setting {names[name]} has no description ({component.module}.{name})")
    for table, notes, known in (
        ("FRAME_NOTES", FRAME_NOTES, {f.__name__ for f in frames}),
        ("CLOSE_CODES", CLOSE_CODES, close_constants),
        ("MACHINE_DEFAULTS", MACHINE_DEFAULTS, settings_keys),
    ):
        found += [f"{table}[{k!r}] names nothing that exists: remove it" for k in sorted(set(notes) - known)]
    return found


# ---------------------------------------------------------------- main

DOCS: dict[Path, Callable[[], str]] = {PROTOCOL_DOC: render_protocol, CONFIGURATION_DOC: render_configuration}


def stale_docs() -> list[Path]:
    return [path for path, render in DOCS.items() if not path.is_file() or path.read_text() != render()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only report stale files (exit 1 if any)")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_docs()
        for path in stale:
            print(f"{path.relative_to(ROOT)} is stale: run `make docs`", file=sys.stderr)
        return 1 if stale else 0
    for problem in problems():
        print(f"warning: {problem}", file=sys.stderr)
    for path, render in DOCS.items():
        text = render()
        if not path.is_file() or path.read_text() != text:
            path.write_text(text)
            print(f"wrote {path.relative_to(ROOT)}")
        else:
            print(f"{path.relative_to(ROOT)} is up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
