"""Importing a framework whose package has the name of one of farm_sdk's modules (`swerex`,
`minisweagent`): with farm_sdk's own folder on sys.path (python run from inside it), the
name would be farm_sdk's file. `beside()` leaves that folder out while the framework is
imported.
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from typing import Iterator

_HERE = os.path.dirname(os.path.abspath(__file__))


@contextmanager
def beside() -> Iterator[None]:
    """sys.path without farm_sdk's folder, for the block."""
    saved = list(sys.path)
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
    try:
        yield
    finally:
        sys.path[:] = saved
