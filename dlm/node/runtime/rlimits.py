"""Raise the open-files limit a member may use, for the node's start-up to call.

A member holds a descriptor per client connection and per peer link, plus its
log segments; the usual soft limit of 1024 caps a busy member well below what
the hard limit allows. ``raise_open_files_limit()`` lifts the soft limit to the
hard one (never lowering it) and says what it did, for the start-up log line.
"""

from __future__ import annotations

import resource
from typing import NamedTuple

FALLBACK_LIMIT = 1 << 20
"""Tried when the hard limit is unlimited, which RLIMIT_NOFILE cannot be set to (Linux
caps descriptors at fs.nr_open, 1048576 by default; macOS at OPEN_MAX)."""


class OpenFilesLimit(NamedTuple):
    before: int
    after: int
    hard: int
    error: str | None
    """Why the soft limit could not be raised (None if it was, or had nothing to do)."""


def raise_open_files_limit() -> OpenFilesLimit:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:  # (-1 on Linux: compare it, never order it)
        return OpenFilesLimit(soft, soft, hard, None)
    targets = [hard] if hard != resource.RLIM_INFINITY else []
    if hard == resource.RLIM_INFINITY or hard > FALLBACK_LIMIT:
        targets.append(FALLBACK_LIMIT)
    error = None
    for target in targets:
        if target <= soft:
            break  # never lower it
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as exc:
            error = str(exc)
            continue
        return OpenFilesLimit(soft, target, hard, None)
    return OpenFilesLimit(soft, soft, hard, error)
