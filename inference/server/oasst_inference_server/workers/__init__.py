"""The worker sockets: the handshake, one connection per worker (its in-flight messages, the jobs it is
sent, the frames it sends, its lifetime), the token relay, trust and compliance checks, and the questions
asked of workers (tokenize, prompt sizes).

May import dispatch, auth, metrics, outages, db, broker, settings; not chats, streams or anything above.
"""
