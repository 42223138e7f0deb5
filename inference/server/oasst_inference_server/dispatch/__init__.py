"""Running generations: message lifecycle, event encoding, worker connections and registry, relay, recovery.

May import metrics, outages, db, broker, settings, errors; not auth or anything above.
"""
