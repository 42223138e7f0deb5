"""``oasst-server``: run the inference server; ``oasst-server admin ...``: the operator's commands."""

from __future__ import annotations

import sys

USAGE = """usage: oasst-server             run the server (settings: OASST_SERVER_* variables, docs/configuration.md)
       oasst-server admin ...   operator commands: create-worker-key, create-api-key, migrate
                                (oasst-server admin --help)"""


def main() -> None:
    args = sys.argv[1:]
    if args[:1] == ["admin"]:
        from oasst_inference_server.admin_cli import main as admin_main

        sys.exit(admin_main(args[1:]))
    if args:
        print(USAGE, file=sys.stderr if args[0] not in ("-h", "--help") else sys.stdout)
        sys.exit(0 if args[0] in ("-h", "--help") else 2)
    from pydantic import ValidationError

    from oasst_inference_server.serve import run
    from oasst_inference_server.settings import get_settings

    try:
        settings = get_settings()
    except ValidationError as exc:
        # Production is the default: a server started with no settings says which secret to set.
        print("oasst-server: refusing to start:", file=sys.stderr)
        messages = [str(error["msg"]).removeprefix("Value error, ") for error in exc.errors()]
        for message in messages:
            print(f"  - {message}", file=sys.stderr)
        if any(message.startswith("production mode") for message in messages):
            print(
                "  (for a local development server set OASST_SERVER_ENVIRONMENT=development; see docs/security.md)",
                file=sys.stderr,
            )
        sys.exit(2)
    run(settings)


if __name__ == "__main__":
    main()
