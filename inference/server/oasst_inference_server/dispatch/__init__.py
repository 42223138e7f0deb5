"""The message state machine: a message's life from enqueue to its end (lifecycle), the claim's statement,
the work frame a claim sends, the pongs' lease extensions, and the recovery loop that repairs what a fault
left behind.

Which job goes next and to which worker is :mod:`..scheduling`'s; the worker sockets that carry the jobs
live in :mod:`..workers` (above this package); readers of a message's events in :mod:`..streams`.

May import scheduling, metrics, outages, events, db, broker, settings; not auth, workers, streams or
anything above.
"""
