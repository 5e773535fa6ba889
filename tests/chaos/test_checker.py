"""The chaos checker on hand-written histories: correct ones pass, planted bugs are caught.

Each planted bug is the history a real bug would leave: a waiter granted on a
lease the cluster had given up (etcd #11456), a `dlm exec` that stops its
command after the deadline, a store that lets a lower token through (a lost
update), a read that misses a grant, a grant the cluster never made.
"""

from __future__ import annotations

from dlm.client.core import lease_deadline
from tests.chaos.checker import (
    ACQUIRE,
    CLOSE,
    FAIL,
    GET,
    HELD,
    INF,
    OK,
    READ,
    RELEASE,
    UNKNOWN,
    WRITE,
    AuditGrant,
    History,
    LeaseFacts,
    LockModel,
    Op,
    Recovery,
    Renewal,
    StoreEvent,
    check,
    client_deadline,
    linearize,
)

TTL = 2000
_ids = iter(range(1_000_000))


def op(client: str, f: str, call: float, ret: float, outcome: str = OK, **kw: object) -> Op:
    return Op(
        id=f"{client}:{next(_ids)}",
        client=client,
        f=f,
        key=kw.pop("key", "k"),  # type: ignore[arg-type]
        lease=kw.pop("lease", client),  # type: ignore[arg-type]
        call=call,
        ret=ret,
        outcome=outcome,
        **kw,  # type: ignore[arg-type]
    )


def library(client: str, *sent: float, killed: float | None = None) -> LeaseFacts:
    """A library lease opened (and renewed) by requests sent at ``sent``, each confirmed
    10 ms later."""
    return LeaseFacts(client, renewals=[Renewal(s, TTL, s + 0.01) for s in sent], killed_at=killed)


def kinds(history: History) -> list[str]:
    verdict = check(history)
    assert not verdict.inconclusive
    return sorted({v.kind for v in verdict.violations})


def store_rmw(
    key: str, *, token: int, read_at: float, value: int, highest: int, op_ids: tuple[str, str]
) -> list[StoreEvent]:
    """A read and a write (one step apart) that the store accepted."""
    return [
        StoreEvent(READ, op_ids[0], key, token, True, highest, value, value, None, read_at),
        StoreEvent(WRITE, op_ids[1], key, token, True, token, value, value + 1, value,
                   read_at + 0.01),
    ]  # fmt: skip


# -- correct histories -------------------------------------------------------------


def test_a_clean_handover_passes() -> None:
    a_read = op("a", READ, 0.3, 0.31, token=10)
    a_write = op("a", WRITE, 0.4, 0.41, token=10)
    b_read = op("b", READ, 1.3, 1.31, token=12)
    b_write = op("b", WRITE, 1.4, 1.41, token=12)
    history = History(
        ops=[
            op("a", ACQUIRE, 0.0, 0.2, token=10),
            a_read,
            a_write,
            op("a", RELEASE, 0.5, 0.6, token=10),
            op("b", ACQUIRE, 0.1, 0.3, FAIL, detail=HELD),
            op("b", ACQUIRE, 1.0, 1.2, token=12),
            op("c", GET, 1.25, 1.26, holder=("b", 12), lease=None),
            b_read,
            b_write,
            op("b", CLOSE, 1.5, 1.6),
        ],
        leases={"a": library("a", 0.0), "b": library("b", 0.1, 1.0)},
        store=store_rmw(
            "k", token=10, read_at=0.305, value=0, highest=0, op_ids=(a_read.id, a_write.id)
        )
        + store_rmw(
            "k", token=12, read_at=1.305, value=1, highest=10, op_ids=(b_read.id, b_write.id)
        ),
        audit=[AuditGrant("n1", "k", 10, "a"), AuditGrant("n2", "k", 12, "b")],
    )
    assert kinds(history) == []


def test_a_lock_freed_by_expiry_after_the_holders_deadline_passes() -> None:
    # a is SIGSTOPped holding the lock; its deadline passes; b gets the lock.
    deadline = lease_deadline(0.0, TTL)
    history = History(
        ops=[
            op("a", ACQUIRE, 0.0, 0.1, token=5),
            op("b", ACQUIRE, 1.0, deadline + 0.2, token=9, wait=True),
            op("a", RELEASE, 4.0, 4.1, FAIL, token=5, detail="not_holder"),
        ],
        leases={"a": library("a", 0.0), "b": library("b", 1.0)},
    )
    assert kinds(history) == []


def test_a_wait_that_ran_out_after_its_grant_raced_in_releases_it() -> None:
    # a waits for k with its member cut off; the grant (token 5) is committed elsewhere and
    # a reader sees it; a's wait runs out and its cleanup release frees k, so b, queued
    # behind, is granted (token 7) before a even closes its lease (seen in make test).
    history = History(
        ops=[
            op("a", ACQUIRE, 0.0, 3.0, FAIL, detail=HELD, wait=True),
            op("r", GET, 1.0, 1.1, holder=("a", 5), lease=None),
            op("b", ACQUIRE, 0.5, 3.001, token=7, wait=True),
            op("a", CLOSE, 3.002, 3.01),
        ],
        leases={
            "a": library("a", 0.0, 0.6, 1.2, 1.8, 2.4),
            "b": library("b", 0.5, 1.1, 1.7, 2.3, 2.9),
        },
    )
    assert kinds(history) == []


def test_a_lease_holds_nothing_after_its_wait_ran_out_until_it_acquires_again() -> None:
    # The same wait, and then b's grant before the reader still sees a holding: not
    # linearizable (a's cleanup release came before b's grant).
    history = History(
        ops=[
            op("a", ACQUIRE, 0.0, 3.0, FAIL, detail=HELD, wait=True),
            op("b", ACQUIRE, 0.5, 3.001, token=7, wait=True),
            op("r", GET, 3.1, 3.2, holder=("a", 5), lease=None),
        ],
        leases={
            "a": library("a", 0.0, 0.6, 1.2, 1.8, 2.4, 3.0),
            "b": library("b", 0.5, 1.1, 1.7, 2.3, 2.9),
        },
    )
    assert kinds(history) == ["not-linearizable"]


def test_a_zombie_write_refused_by_the_store_passes() -> None:
    deadline = lease_deadline(0.0, TTL)
    zombie = op("a", WRITE, 3.0, 3.01, FAIL, token=5, detail="refused")
    b_read = op("b", READ, 2.5, 2.51, token=9)
    history = History(
        ops=[
            op("a", ACQUIRE, 0.0, 0.1, token=5),
            op("b", ACQUIRE, 1.0, deadline + 0.3, token=9, wait=True),
            b_read,
            zombie,
        ],
        leases={"a": library("a", 0.0), "b": library("b", 1.0)},
        store=[
            StoreEvent(READ, b_read.id, "k", 9, True, 0, 0, 0, None, 2.505),
            StoreEvent(WRITE, zombie.id, "k", 5, False, 9, 0, 0, 0, 3.005),
        ],
    )
    verdict = check(history)
    assert verdict.ok, verdict.violations
    assert verdict.stats["zombie_refused"] == 1


def test_unknown_outcomes_may_or_may_not_have_happened() -> None:
    # c's acquire timed out (unknown), and then a read shows it did happen; d's did not.
    history = History(
        ops=[
            op("c", ACQUIRE, 0.0, INF, UNKNOWN),
            op("d", ACQUIRE, 0.0, INF, UNKNOWN),
            op("r", GET, 1.0, 1.1, holder=("c", 7), lease=None),
            op("e", ACQUIRE, 1.2, 1.3, FAIL, detail=HELD),
        ],
        leases={"c": library("c", 0.0), "d": library("d", 0.0)},
    )
    assert kinds(history) == []


def test_the_search_finds_an_order_that_is_not_the_order_of_completion() -> None:
    # b's acquire was invoked first and completed last; a's release in between frees it.
    history = History(
        ops=[
            op("a", ACQUIRE, 0.0, 0.1, token=3),
            op("b", ACQUIRE, 0.2, 2.0, token=4, wait=True),
            op("a", RELEASE, 0.5, 0.6, token=3),
            op("r", GET, 0.3, 0.4, holder=("a", 3), lease=None),
        ],
        leases={"a": library("a", 0.0), "b": library("b", 0.2)},
    )
    assert kinds(history) == []


# -- planted bugs --------------------------------------------------------------------


def test_etcd_11456_a_waiter_granted_on_a_lease_the_cluster_had_given_up() -> None:
    # w queued; the cluster expired w's lease early (its last renewal, sent at 2.5, was
    # confirmed) but still granted w the lock at 3.0 without checking the lease, and then
    # granted it to c when the expiry went through. w counts on it until its deadline.
    history = History(
        ops=[
            op("h", ACQUIRE, 0.0, 0.1, token=10),
            op("w", ACQUIRE, 0.5, 3.05, token=30, wait=True),
            op("h", RELEASE, 2.9, 3.0, token=10),
            op("c", ACQUIRE, 3.08, 3.1, token=31),
            op("w", RELEASE, 3.5, 3.6, FAIL, token=30, detail="not_holder"),
        ],
        leases={
            "h": library("h", 0.0),
            "w": library("w", 0.5, 1.2, 1.9, 2.5),
            "c": library("c", 3.08),
        },
    )
    assert kinds(history) == ["not-linearizable", "overlap"]


def test_an_exec_that_stops_its_command_after_the_deadline() -> None:
    # CMD was still alive at 5.0, but the cluster (rightly, by the lease) granted the
    # lock to b at 4.8: the guard killed late.
    exec_lease = LeaseFacts("lane", kind="exec", cmd_start=0.5, last_sign=5.0)
    history = History(
        ops=[
            op("lane", ACQUIRE, 0.0, 0.5, token=10, lease="x"),
            op("b", ACQUIRE, 1.0, 4.8, token=11, wait=True),
        ],
        leases={"x": exec_lease, "b": library("b", 1.0, 1.6, 2.2, 2.8, 3.4, 4.0)},
    )
    assert kinds(history) == ["not-linearizable", "overlap"]
    # The same run with the guard on time (CMD gone at 4.7) passes.
    history.leases["x"] = LeaseFacts("lane", kind="exec", cmd_start=0.5, last_sign=4.7)
    assert kinds(history) == []


def test_a_frozen_exec_is_fencings_case_not_an_overlap() -> None:
    # The whole exec tree was frozen at 1.0; CMD wrote again after it was thawed at 6.0.
    exec_lease = LeaseFacts("lane", kind="exec", cmd_start=0.5, last_sign=6.0, frozen_at=1.0)
    late = op("lane", WRITE, 6.0, 6.01, FAIL, token=10, detail="refused", lease="x")
    b_read = op("b", READ, 4.0, 4.01, token=11)
    history = History(
        ops=[
            op("lane", ACQUIRE, 0.0, 0.5, token=10, lease="x"),
            op("b", ACQUIRE, 1.0, 3.5, token=11, wait=True),
            b_read,
            late,
        ],
        leases={"x": exec_lease, "b": library("b", 1.0, 1.6, 2.2, 2.8, 3.4)},
        store=[
            StoreEvent(READ, b_read.id, "k", 11, True, 0, 0, 0, None, 4.005),
            StoreEvent(WRITE, late.id, "k", 10, False, 11, 0, 0, 0, 6.005),
        ],
    )
    verdict = check(history)
    assert verdict.ok, verdict.violations
    assert verdict.stats["zombie_refused"] == 1


def test_a_store_that_lets_a_lower_token_through_loses_an_update() -> None:
    a_read = op("a", READ, 0.3, 0.31, token=10)
    a_write = op("a", WRITE, 3.0, 3.01, token=10)
    b_read = op("b", READ, 2.5, 2.51, token=11)
    b_write = op("b", WRITE, 2.6, 2.61, token=11)
    deadline = lease_deadline(0.0, TTL)
    history = History(
        ops=[
            op("a", ACQUIRE, 0.0, 0.1, token=10),
            a_read,
            op("b", ACQUIRE, 1.0, deadline + 0.2, token=11, wait=True),
            b_read,
            b_write,
            a_write,
        ],
        leases={"a": library("a", 0.0), "b": library("b", 1.0)},
        store=[
            StoreEvent(READ, a_read.id, "k", 10, True, 0, 0, 0, None, 0.305),
            StoreEvent(READ, b_read.id, "k", 11, True, 10, 0, 0, None, 2.505),
            StoreEvent(WRITE, b_write.id, "k", 11, True, 11, 0, 1, 0, 2.605),
            # The bug: token 10 is below the 11 already seen, and is accepted anyway.
            StoreEvent(WRITE, a_write.id, "k", 10, True, 11, 1, 1, 0, 3.005),
        ],
    )
    found = kinds(history)
    assert "store-order" in found
    assert "lost-update" in found


def test_a_read_that_misses_a_grant_is_not_linearizable() -> None:
    history = History(
        ops=[
            op("a", ACQUIRE, 0.0, 0.1, token=3),
            op("r", GET, 0.5, 0.6, holder=None, lease=None),
        ],
        leases={"a": library("a", 0.0)},
    )
    assert kinds(history) == ["not-linearizable"]


def test_tokens_that_go_backwards_are_not_linearizable() -> None:
    history = History(
        ops=[
            op("a", ACQUIRE, 0.0, 0.1, token=8),
            op("a", RELEASE, 0.2, 0.3, token=8),
            op("b", ACQUIRE, 0.4, 0.5, token=6),
        ],
        leases={"a": library("a", 0.0), "b": library("b", 0.4)},
    )
    assert kinds(history) == ["not-linearizable"]


def test_a_grant_missing_from_the_audit_logs_is_reported() -> None:
    history = History(
        ops=[op("a", ACQUIRE, 0.0, 0.1, token=8)],
        leases={"a": library("a", 0.0)},
        audit=[AuditGrant("n1", "k", 8, "someone-else"), AuditGrant("n2", "k", 8, "a")],
    )
    assert "audit-conflict" in kinds(history)
    history.audit = [AuditGrant("n1", "k", 9, "a")]
    assert kinds(history) == ["lost-grant"]


def test_a_lock_that_stays_unavailable_after_its_holder_died_is_reported() -> None:
    history = History(
        recoveries=[
            Recovery("k", died=1.0, healed=2.0, available=4.0, bound=3.0),
            Recovery("j", died=1.0, healed=2.0, available=6.0, bound=3.0),
            Recovery("i", died=1.0, healed=2.0, available=None, bound=3.0),
        ]
    )
    verdict = check(history)
    assert [(v.kind, v.key) for v in verdict.violations] == [
        ("unavailable", "j"),
        ("unavailable", "i"),
    ]


# -- the pieces ------------------------------------------------------------------------


def test_a_confirmation_after_the_deadline_does_not_extend_it() -> None:
    first = lease_deadline(0.0, TTL)
    assert client_deadline([Renewal(0.0, TTL, 0.01)]) == first
    late = Renewal(1.0, TTL, first + 0.5)  # sent in time, answered too late
    assert client_deadline([Renewal(0.0, TTL, 0.01), late]) == first
    on_time = Renewal(1.0, TTL, 1.1)
    assert client_deadline([Renewal(0.0, TTL, 0.01), on_time]) == lease_deadline(1.0, TTL)


def test_the_search_gives_up_within_its_budget() -> None:
    ops = [op(f"c{i}", ACQUIRE, 0.0, INF, UNKNOWN) for i in range(30)]
    ops.append(op("r", GET, 1.0, 1.1, holder=("nobody", 1), lease=None))
    model = LockModel({})
    from tests.chaos.checker import INIT

    result = linearize(ops, model.step, frozenset({INIT}), budget=500)
    assert result.linearizable is None
