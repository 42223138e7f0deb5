"""The OpenAI-compatible API (``/v1``): its service, and answers and streams in OpenAI's shapes.

May import streams, chats, dispatch, auth, db, broker, metrics, settings, errors; not api or admission.
"""
