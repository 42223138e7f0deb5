"""``oasst-server``: run the inference server with uvicorn."""

from __future__ import annotations

import uvicorn

from oasst_inference_server.logging_setup import configure_logging
from oasst_inference_server.main import create_app
from oasst_inference_server.settings import get_settings


def main() -> None:
    settings = get_settings()
    configure_logging(settings.log_level)
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_config=None,
        timeout_graceful_shutdown=10,
        ws_ping_interval=None,  # the protocol has its own pings with capacity reports
        # Worker frames are a few dozen bytes: deflate would cost CPU per token on both ends and save
        # next to nothing.
        ws_per_message_deflate=False,
    )


if __name__ == "__main__":
    main()
