"""A request the backend refuses: :class:`InvalidRequest`, answered 422 with ``error_type`` "validation"
(``errors.py``), which the worker reports as a failure of that message alone. Here, below every layer that
raises it: parameter checks (``validation.py``), grammars (``grammar.py``) and the engine."""

from __future__ import annotations


class InvalidRequest(Exception):
    """A request the backend refuses with 422 and error_type "validation"."""
