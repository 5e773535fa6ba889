"""The answer to `dlm config get|list` (a ``config_get`` read): the cluster-wide settings
as this member has applied them (dlm/node/locks/settings.py).

Pure: the node machine calls it for a confirmed read (tests/unit/node/test_purity.py).
"""

from __future__ import annotations

from typing import Any

from dlm.node import locks
from dlm.node.locks.settings import KEYS
from dlm.wire import ConfigGet, ErrorCode, error, ok


def settings_reply(req: ConfigGet, machine: locks.LockStateMachine) -> dict[str, Any]:
    """``settings``: each setting (or the one named) in ms, None when not set; refused
    with one line before cluster version 5 or for a setting that does not exist."""
    if machine.version < 5:
        return error(
            req.id,
            ErrorCode.UNAVAILABLE,
            "cluster settings (dlm config) need every member on protocol version 5, and an "
            "upgrade is in progress: retry once every member runs this release",
            retry_after_ms=1000,
        )
    rows = machine.settings.rows()
    if req.setting is not None:
        if req.setting not in rows:
            return error(
                req.id,
                ErrorCode.BAD_REQUEST,
                f"unknown setting {req.setting!r}: the settings are {', '.join(KEYS)}",
            )
        rows = {req.setting: rows[req.setting]}
    return ok(req.id, settings=rows)
