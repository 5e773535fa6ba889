"""Runs the `dlm` command as `python -m dlm` would, behind the chaos run's network map.

In a chaos run members reach each other through fault-injecting proxies (each
member's ``--peers`` names a proxy per link), so a follower's NOT_LEADER reply
points a client at the proxy *it* uses for the leader. A client must not take
that path: its own way to the leader is its own proxy (or the leader's real
address), or a partition of one link would silently cut clients too. So this
launcher maps the address a redirect names to the one this client uses, from
``DLM_CHAOS_ROUTES`` (a JSON object), the way a NAT would; everything else is
the `dlm` command itself. The library workers (worker.py) install the same map.
"""

from __future__ import annotations

import json
import os


def install_routes(routes: dict[str, str]) -> None:
    """Makes every client of this process follow redirects through ``routes``."""
    from dlm.client import core

    if not routes:
        return
    original = core.Router.redirect

    def redirect(self: core.Router, addr: str, source: str | None = None) -> None:
        original(self, routes.get(addr, addr), source)

    core.Router.redirect = redirect  # type: ignore[method-assign]


def main() -> None:
    install_routes(json.loads(os.environ.get("DLM_CHAOS_ROUTES", "{}")))
    from dlm.cli.main import main as dlm_main

    dlm_main()


if __name__ == "__main__":
    main()
