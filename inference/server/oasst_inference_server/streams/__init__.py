"""Reading a message's events (the broker stream, the database as the fallback), what their readers ask
besides the stream (the message's state, its queue position, its rebuilt terminal event), and their SSE
framing.

May import scheduling, auth, events, db, broker, metrics, settings, domain_errors; not dispatch, chats or
anything above.
"""
