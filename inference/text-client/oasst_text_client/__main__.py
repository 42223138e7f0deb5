"""Entry point of ``oasst-chat`` and ``python -m oasst_text_client``.

Exit status: 0 success, 1 an error (server unreachable, refused request, failed answer, unknown model),
2 bad command-line arguments, 130 interrupted by Ctrl-C in pipe mode.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from pydantic import ValidationError

from oasst_text_client._exceptions import ApiError, TextClientError, UsageError
from oasst_text_client.api import ChatApiClient
from oasst_text_client.cli import CliOptions, parse_args
from oasst_text_client.pipe import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_OK, run_pipe
from oasst_text_client.repl import Repl, open_history
from oasst_text_client.session import ChatSession, choose_model, effective_sampling


def main(argv: Sequence[str] | None = None) -> int:
    options = parse_args(argv)
    try:
        return _run(options, interactive=sys.stdin.isatty())
    except TextClientError as exc:
        print(f"oasst-chat: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("oasst-chat: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader of our output went away (e.g. `| head -1`): not an error worth a traceback.
        _silence_stdout()
        return EXIT_ERROR


def _run(options: CliOptions, interactive: bool) -> int:
    with ChatApiClient(options.server_url) as api:
        user = _sign_in(api, options)
        models = api.list_models()
        if options.list_models:
            for model in models:
                workers = f"{model.worker_count} worker{'s' if model.worker_count != 1 else ''}"
                print(f"{model.name}\t{workers}\t{model.description}".rstrip())
            return EXIT_OK
        model = choose_model(models, options.model)
        try:
            sampling = effective_sampling(model, options.sampling_overrides)
        except ValidationError as exc:
            raise UsageError(f"the sampling parameters are invalid for model {model.name}: {exc}") from exc
        session = ChatSession(api, model.name, sampling, options.system_prompt)
        if interactive:
            banner = (
                f"Connected to {options.server_url} as {user}; model {model.name}. "
                "Type /help for commands, Ctrl-D to quit."
            )
            return Repl(session, sys.stdout, history=open_history(options.history_file)).run(banner)
        print(f"oasst-chat: model {model.name}", file=sys.stderr)
        return run_pipe(session, sys.stdin, sys.stdout, sys.stderr, buffer=options.buffer)


def _sign_in(api: ChatApiClient, options: CliOptions) -> str:
    """Sign in with the API key, or else through the debug login; the user's name."""
    if options.api_key:
        api.use_api_key(options.api_key)
        try:
            return api.whoami().display_name
        except ApiError as exc:
            if exc.status_code == 401:
                raise UsageError(f"the server refused the API key: {exc.detail}") from exc
            raise
    try:
        api.login(options.username)
    except ApiError as exc:
        if exc.code == "debug_auth_disabled":
            raise UsageError(
                "this server has no debug login (production): sign in with --api-key or OASST_API_KEY"
            ) from exc
        raise
    return options.username


def _silence_stdout() -> None:
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


if __name__ == "__main__":
    sys.exit(main())
