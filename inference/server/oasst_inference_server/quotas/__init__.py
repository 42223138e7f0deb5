"""Usage limits of API keys and users: requests and tokens per minute, token and money budgets per day or
month, model allow-lists.

The limits an admin sets are stored in the database (:mod:`.limits_store`); the counters they are checked
against live in the broker (:mod:`..broker.counters`), so every replica agrees: admission checks (and
counts) requests atomically (:mod:`.gate`), and each finished generation is charged its reported tokens and
their price once (:mod:`.charging`). Budget counters are rebuilt from the database when the broker lost
them (:mod:`.usage_rows`). These add to the settings' per-user limits (``admission.rate_limit``).

May import db, broker, settings, domain_errors and oasst_shared; not dispatch or anything above.
"""
