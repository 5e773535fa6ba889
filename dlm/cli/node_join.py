"""`dlm node start --join`: the new member asks the running cluster, as a client, to add it.

The member's runtime (dlm/node/runtime) must not import the client library, which sits
beside it, so the command, above both, hands this to ``start_from_options``.
"""

from __future__ import annotations

import time
from collections.abc import Generator
from dataclasses import replace

from dlm.client import core
from dlm.client.errors import BadRequest, ChangeInProgress, DlmError
from dlm.client.sync import Client
from dlm.node.runtime.config.node_config import NodeConfig
from dlm.node.runtime.main import StartupError
from dlm.node.runtime.security import NodeSecurity
from dlm.views import MembersView
from dlm.wire import MemberAdd, Members, parse_addr

JOIN_TIMEOUT_S = 30.0
"""How long `--join` keeps asking, through leader changes and other changes in progress."""


def _add_flow(
    ctx: core.Context, request: MemberAdd, partition: int
) -> Generator[core.Action, core.Outcome, MembersView]:
    """``member_add`` in one partition's group (each partition of a member joins its own)."""
    _, reply = yield from core.change(ctx, request, partition=partition)
    return core.read_reply(MembersView, core.payload(reply))


def _members_flow(
    ctx: core.Context, partition: int
) -> Generator[core.Action, core.Outcome, MembersView]:
    _, reply = yield from core.call(ctx, core.without_id(Members(id=0)), partition=partition)
    return core.read_reply(MembersView, core.payload(reply))


def join_cluster(config: NodeConfig, security: NodeSecurity | None) -> NodeConfig:
    """Asks the running cluster (``--join``) to add this member as a learner; returns the
    config with the cluster's first members, which this member must boot with. It asks as
    a client, with the client secret and the TLS identity the member was given. A
    partition's process (``config.partition``) asks its own partition's group, through
    the same members: every partition has the same members."""
    partition = config.partition
    where = ",".join(config.join)
    deadline = time.monotonic() + JOIN_TIMEOUT_S
    try:
        with Client(
            list(config.join),
            timeout=JOIN_TIMEOUT_S,
            secret=security.client_secret if security else None,
            tls=security.peer_tls if security else None,
        ) as client:
            try:
                for attempt in range(1_000):
                    try:
                        if partition == 0:
                            view = client.add_member(config.node_id, config.address)
                        else:
                            request = MemberAdd(
                                id=0, member=config.node_id, address=config.address, seq=0
                            )
                            view = client._run(_add_flow(client._ctx, request, partition))
                        break
                    except ChangeInProgress:
                        # Another member joining, or a learner's promotion: it commits in
                        # moments, and then it is our turn.
                        if time.monotonic() > deadline:
                            raise
                        time.sleep(min(1.0, 0.02 * 2**attempt))
                else:
                    raise StartupError(f"cannot join {where}: the cluster stayed busy")
            except BadRequest as exc:
                if "already a member" not in str(exc):
                    raise
                # A retried join whose first attempt went through: fine if it is us.
                view = (
                    client.members_view()
                    if partition == 0
                    else client._run(_members_flow(client._ctx, partition))
                )
                mine = [m for m in view.members if m.id == config.node_id]
                if not mine or mine[0].address != config.address:
                    raise StartupError(
                        f"cannot join {where}: {config.node_id} is already a member at another "
                        "address; pick another --id"
                    ) from None
    except DlmError as exc:
        raise StartupError(f"cannot join {where}: {exc}") from None
    bootstrap = view.bootstrap
    if not bootstrap:
        raise StartupError(
            f"cannot join {where}: the member did not say who the first members were"
        )
    peers = {str(node): parse_addr(str(addr)) for node, addr in bootstrap.items()}
    # The leader may be a member that joined after the first ones: until this member's log
    # names the configuration, it knows where the others are only from this answer.
    current: dict[str, tuple[str, int]] = {}
    for member in view.members:
        if member.id is not None and member.id != config.node_id:
            if member.address is None:
                continue  # unknown address: the log will say it
            try:
                current[member.id] = parse_addr(member.address)
            except ValueError:
                continue
    # A restored or recovered cluster is a new incarnation: its members talk only to
    # members of the same one, so this member takes it (recorded in node.json).
    incarnation = view.incarnation or 0
    if not 0 <= incarnation < 2**63:
        incarnation = 0
    return replace(config, peers=peers, join_members=current, incarnation=incarnation)
