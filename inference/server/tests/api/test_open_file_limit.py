"""The connection cap and the open-file limit: the server raises its soft limit as far as the cap needs
(when the hard limit allows), and otherwise lowers the cap below what the process can open, since past
the limit ``accept`` fails, and so would the process's own database connections. Each case runs in a
child process with the limits it describes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from oasst_inference_server.api.connection_guard import RESERVED_DESCRIPTORS

CHILD = """
import json, resource, sys
soft, hard = (int(v) for v in sys.argv[1:3])
resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
from oasst_inference_server.api.connection_guard import usable_connections
cap = usable_connections(int(sys.argv[3]))
print(json.dumps([cap, resource.getrlimit(resource.RLIMIT_NOFILE)[0]]))
"""


def usable(soft: int, hard: int, wanted: int) -> tuple[int, int]:
    """(the cap, the soft limit afterwards) in a process started with these limits."""
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(soft), str(hard), str(wanted)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    cap, new_soft = json.loads(done.stdout.strip().splitlines()[-1])
    return cap, new_soft


@pytest.mark.parametrize(
    "soft, hard, wanted, cap, new_soft",
    [
        (1024, 1024, 16_384, 1024 - RESERVED_DESCRIPTORS, 1024),  # cannot be raised: the cap comes down
        (1024, 4096, 16_384, 4096 - RESERVED_DESCRIPTORS, 4096),  # raised as far as it goes
        (1024, 4096, 100, 100, 1024),  # enough already: left alone
        (512, 8192, 2000, 2000, 2000 + RESERVED_DESCRIPTORS),  # raised just as far as needed
        (200, 200, 50, 1, 200),  # not even the reserve: one connection still
    ],
)
def test_the_cap_fits_the_open_file_limit(soft, hard, wanted, cap, new_soft):
    assert usable(soft, hard, wanted) == (cap, new_soft)
