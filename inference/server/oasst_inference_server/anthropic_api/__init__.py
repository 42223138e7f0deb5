"""The Anthropic Messages API (``/v1/messages``, ``/v1/messages/count_tokens``): its wire models, the
conversion of its requests into the OpenAI-compatible API's internal request, its service, its
server-sent events and the serving object each route makes its one call into (``serving``). Every
request goes through the same submission path, queue, limits and usage records as
``/v1/chat/completions`` (:mod:`oasst_inference_server.openai_api`).

May import openai_api, submission, admission, streams, chats, dispatch, auth, db, broker, metrics,
settings; not api, errors or FastAPI.
"""
