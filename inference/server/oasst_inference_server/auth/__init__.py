"""Who is calling: signed tokens, refresh tokens, OAuth sign-in, trusted clients, API keys, worker keys.

May import metrics, db, broker, settings, errors; not dispatch or anything above.
"""
