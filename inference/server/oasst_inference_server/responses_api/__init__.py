"""The OpenAI Responses API (``/v1/responses``): its request and object shapes, its typed event
sequence, the service that submits responses on the ``/v1`` path (``openai_api``) and stores them, and
the serving object each route makes its one call into (``serving``).

May import openai_api, submission, admission, streams, chats, dispatch, auth, db, broker, metrics,
settings, errors; not api.
"""
