"""The OpenAI-compatible API (``/v1``): its service, and answers and streams in OpenAI's shapes.

May import submission, admission, streams, chats, dispatch, auth, db, broker, metrics, settings, errors;
not api.
"""
