"""The database: the engine and sessions (``engine``), the tables (``models``), JSON columns read back
(``stored_json``), the Alembic migrations.

May import settings, errors, logging_setup; not broker or anything above.
"""
