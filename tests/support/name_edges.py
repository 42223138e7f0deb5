"""Names that differ from a valid one only at an edge: a trailing or leading newline (which Python's
``re.match`` lets through a ``$``), spaces, controls, look-alike characters, or nothing at all. Every
field that names something refuses them (oasst_shared/tests/test_names.py,
tests/openai_api/test_request_names.py)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

EDGES = [
    "name\n",
    "name\r\n",
    "\nname",
    "name\r",
    "na me",
    "name ",
    "name\t",
    "name\x00",
    "name\u2028",  # a line separator
    "name\u200b",  # a zero-width space
    "nаme",  # a Cyrillic "a"
    "",
]


def refused(build: Any, name: str) -> None:
    with pytest.raises(ValidationError):
        build(name)
