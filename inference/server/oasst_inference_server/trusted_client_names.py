"""Trusted-client namespaces: each frontend key is bound to one client name, and the users that
frontend creates live under their own provider, ``trusted:<name>``.

The prefix keeps a frontend named like a sign-in method (``discord``, ``github``, ``debug``) away
from the users of that sign-in method: provider values of other logins never start with it.
"""

from __future__ import annotations

import re

DEFAULT_CLIENT_NAME = "website"  # the original Open-Assistant web frontend's client name
TRUSTED_PROVIDER_PREFIX = "trusted:"
CLIENT_NAME_PATTERN = r"^[a-z0-9][a-z0-9_.-]{0,23}$"  # fits the 32-character provider column
_NAME = re.compile(CLIENT_NAME_PATTERN)


def parse_trusted_client_entry(entry: str) -> tuple[str, str]:
    """``NAME:KEY`` -> (NAME, KEY); a bare key belongs to the frontend named ``website``."""
    name, sep, key = entry.partition(":")
    if not sep:
        return DEFAULT_CLIENT_NAME, entry
    if not _NAME.fullmatch(name):  # re.match would take a name ending in a newline
        raise ValueError(
            f"OASST_SERVER_TRUSTED_CLIENT_API_KEYS: client name {name[:40]!r} must match {CLIENT_NAME_PATTERN}"
        )
    return name, key


def trusted_provider(client_name: str) -> str:
    return TRUSTED_PROVIDER_PREFIX + client_name
