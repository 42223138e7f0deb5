"""A user's chats and messages, their client settings, and deleting an account.

May import dispatch, auth, db, broker, metrics, settings, errors; not streams or anything above.
"""
