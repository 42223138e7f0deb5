"""Admission of a generation: message length, chat size, queue capacity, per-user rate and concurrency,
what the model's workers can honour.

May import chats, dispatch, auth, db, broker, metrics, settings, errors; not api, openai_api or submission.
"""
