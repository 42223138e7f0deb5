"""A moment a client names in a query (``since``, ``until``, ``before``): any ISO date or time, within
years the server can compute with. Year 1 or 9999 with a zone offset cannot be moved to UTC, and a
window of days cannot be taken off year 1: past these bounds such a value is a 422, not a 500."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Annotated

from pydantic import AfterValidator

EARLIEST_YEAR = 1900
LATEST_YEAR = 9000


def _bounded(moment: datetime) -> datetime:
    if not EARLIEST_YEAR <= moment.year <= LATEST_YEAR:
        raise ValueError(f"a year from {EARLIEST_YEAR} to {LATEST_YEAR}")
    if moment.tzinfo is not None:
        moment.astimezone(timezone.utc)  # within the bounds above this cannot overflow
    return moment


Moment = Annotated[datetime, AfterValidator(_bounded)]
