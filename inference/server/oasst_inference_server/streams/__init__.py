"""Reading a message's events (the broker stream, the database as the fallback) and their SSE framing.

May import dispatch, auth, db, broker, metrics, settings, errors; not chats or anything above.
"""
