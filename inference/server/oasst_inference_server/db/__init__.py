"""The database: the engine and sessions (``engine``), the tables (``models``), the Alembic migrations.

May import settings, errors, logging_setup; not broker or anything above.
"""
