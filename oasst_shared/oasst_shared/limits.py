"""Hard bounds shared by the server, the worker and the clients: what no request may exceed, whatever
the server's settings. (Settings may lower the per-deployment limits below these; docs/security.md
lists both.)"""

from __future__ import annotations

MAX_STOP_SEQUENCES = 4  # TGI's default limit
MAX_STOP_SEQUENCE_LENGTH = 256  # characters per stop sequence
MAX_TOP_K = 100_000  # beyond any vocabulary in use
MAX_NEW_TOKENS = 65_536
MAX_TITLE_LENGTH = 200  # characters of a chat title (the database column's size)
MAX_MESSAGE_LENGTH = 32_000  # characters of a chat message or a system prompt (settings lower it)
MAX_REQUEST_MESSAGES = 2_048  # messages of one OpenAI-style request (settings lower it)
# Nesting of arrays and objects in any JSON a client sends (a request body, a token, a header). Below
# what every parser on the way accepts: pydantic's JSON parser, which reads the worker's frames (a frame
# wraps a body's values in a few more levels), stops at 200, its serializer at 255, Python's json
# module at about 990 minus the caller's stack.
MAX_JSON_DEPTH = 128
