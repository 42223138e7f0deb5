"""A stand-in for ``text-generation-launcher``: takes the launcher's arguments and serves the scripted fake
backend (``fake_backend.py``) on its ``--hostname``/``--port``; ``/info`` also reports how it was started
(its arguments, ``CUDA_VISIBLE_DEVICES`` and process id), so tests see what a managed worker gave it.

For fault injection and the managed-backend tests only: a worker started with
``OASST_WORKER_MANAGED_BACKEND=tgi`` and ``OASST_WORKER_MANAGED_BACKEND_COMMAND`` naming this script.
"""

from __future__ import annotations

import argparse
import os
import sys

import uvicorn
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fake_backend  # noqa: E402  (beside this script: it is run as a script, not as a module)


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(prog="text-generation-launcher")
    parser.add_argument("--model-id", required=True)
    parser.add_argument("--hostname", default="0.0.0.0")
    parser.add_argument("--port", "-p", type=int, default=3000)
    parser.add_argument("--num-shard", type=int)
    return parser.parse_known_args(argv)


ARGS, OTHER = parse(sys.argv[1:])
if "--fail-to-start" in OTHER:  # a model that cannot load: the launcher exits before it serves
    sys.exit(3)


async def info(_request: Request) -> Response:
    return JSONResponse(
        {
            "model_id": ARGS.model_id,
            "max_input_length": 1000,
            "max_total_tokens": 2000,
            "chat_template": fake_backend.CHATML,
            "argv": sys.argv[1:],
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "pid": os.getpid(),
        }
    )


app = fake_backend.app
app.router.routes[:] = [r for r in app.router.routes if not (isinstance(r, Route) and r.path == "/info")]
app.router.routes.append(Route("/info", info))

if __name__ == "__main__":
    uvicorn.run(app, host=ARGS.hostname, port=ARGS.port, log_level="warning")
