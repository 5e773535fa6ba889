"""`dlm auth add|list|remove|rotate|set`: the cluster's client identities, managed by an
admin.

An identity's secret is made here, on the admin's host, and written to the
credential file (mode 600) that the identity's jobs use with --secret-file /
DLM_SECRET_FILE; the cluster gets only its verifier (dlm/auth.py), so neither
the log, the snapshots, `dlm store inspect` nor a backup holds anything a
client could log in with. The file is created before the request is sent and
removed again if the cluster refuses it, so a refused add leaves nothing behind.

`dlm auth set NAME --max-leases N ...` gives one identity its own quotas (kept in the
replicated identity table, so every member enforces them); `--max-X default` puts one
back to the members' `--identity-max-X` flag, `--clear` all of them; limits not named keep
their setting.

`dlm auth remove` draws a request id once and sends it with every re-send of the request
(the client library re-sends after a lost answer): a re-send whose first attempt removed
the identity is answered done (exit 0). Removing a name nobody has, or one another
removal took away, is still refused (exit 2), so a typo is never taken for success.

A limited identity's refusals exit 77 (PERMISSION_DENIED), as dlm.cli.exits says.

In a partitioned cluster every change goes to every partition's group (each enforces
its own copy of the identity table: dlm/cli/fanout.py). Each is idempotent per
partition: an add or rotate sends the same key everywhere, a removal the same request
id. A change some partitions did not take exits non-zero naming them; the same command
run again completes it: ``add``/``rotate`` with ``--out`` naming the credential file the
first run wrote re-send that credential's key instead of making a new one.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from dlm.cli.exits import USAGE, CliError, usage_error
from dlm.cli.output import JSON, TSV, emit_json, emit_tsv, escape, print_table, say
from dlm.cli.settings import Settings

if TYPE_CHECKING:
    from dlm.client.sync import Client

ROLES = ("client", "admin")
QUOTA_KINDS = ("leases", "locks", "connections", "inflight")
LIMIT_FIELDS = tuple(f"max_{kind}" for kind in QUOTA_KINDS)
FIELDS = ("name", "role", "prefixes", "key_id", "rotating", "old_key_until_ms", *LIMIT_FIELDS)
DEFAULT = "default"


def check_name(name: str) -> None:
    from dlm.limits import check_identity_name

    problem = check_identity_name(name)
    if problem is not None:
        raise usage_error(f"bad NAME '{escape(name)}': {problem}")
    if name == "admin":
        raise usage_error(
            "'admin' is the built-in admin (whoever holds the cluster's client secret): "
            "choose another name"
        )


def _write_credential(out: str, name: str) -> tuple[tuple[bytes, bytes, bytes], bool]:
    """Creates ``out`` (mode 600) with a new credential for ``name``; its verifier, and
    True. A file that already holds ``name``'s credential (a re-run of a change some
    partitions did not take) is used as it is: its verifier, and False."""
    from dlm import auth

    existing = _existing_credential(out, name)
    if existing is not None:
        return existing, False
    content, verifier = auth.new_credential(name)
    try:
        auth.write_credential_file(out, content)
    except auth.SecretFileError as exc:
        raise CliError("USAGE", str(exc), USAGE) from None
    return verifier, True


def _existing_credential(out: str, name: str) -> tuple[bytes, bytes, bytes] | None:
    """The verifier of ``name``'s credential in ``out`` (None: no such file, or not one)."""
    from dlm import auth

    try:
        with open(out, "rb") as f:
            content = f.read(4096)
    except OSError:
        return None
    parsed = auth.parse_credential(content)
    if parsed is None or parsed[0] != name:
        return None
    return auth.derive_verifier(name, parsed[1])


def _send(settings: Settings, out: str | None, make: Any) -> dict[str, Any]:
    """Sends the request ``make(client)`` builds; on any failure removes ``out`` again."""
    try:
        client = settings.connect()
        try:
            answer: dict[str, Any] = make(client)
        finally:
            client.close()
    except BaseException:
        _forget(out)
        raise
    return answer


def _partitions(count: int) -> dict[str, int]:
    """``partitions`` in a partitioned cluster's JSON answer (left out for one)."""
    return {"partitions": count} if count > 1 else {}


def _forget(out: str | None) -> None:
    if out is not None:
        try:
            os.unlink(out)
        except OSError:
            pass


def _change(settings: Settings, out: str | None, request: Any, what: str) -> int:
    """Sends the change ``request`` to every partition (dlm/cli/fanout.py); the partition
    count. ``out``: the credential file this run created, removed again unless some
    partition took its key."""
    from dlm.cli.fanout import FanOut, settle, to_every_partition

    def send(client: Client, partition: int) -> dict[str, Any]:
        if partition == 0:
            return client.auth_change(request)
        return client.auth_change(request, partition=partition)

    def had_it(exc: Exception) -> bool:
        # A removal re-run where an earlier run removed it already.
        return request.TYPE == "auth_remove" and "removed it earlier" in str(exc)

    result: FanOut[dict[str, Any]] = FanOut()

    def make(client: Client) -> dict[str, Any]:
        nonlocal result
        result = to_every_partition(
            lambda: int(getattr(client, "partitions", 1)),
            lambda p: send(client, p),
            had_it=had_it,
        )
        return {}

    _send(settings, out, make)
    if not result.took:
        _forget(out)
    settle(result, what)
    return result.partitions


def add(settings: Settings, name: str, role: str, prefixes: list[str], out: str | None) -> None:
    from dlm.limits import check_identity_prefixes
    from dlm.wire import AuthAdd

    check_name(name)
    if role not in ROLES:
        raise usage_error(f"bad --role '{escape(role)}': use client or admin")
    problem = check_identity_prefixes(prefixes)
    if problem is not None:
        raise usage_error(f"bad --prefix: {problem}")
    if role == "client" and not prefixes:
        raise usage_error(
            "a client identity needs at least one --prefix (the keys it may lock start with it)"
        )
    if role == "admin" and prefixes:
        raise usage_error("an admin may lock every key: --prefix is for --role client")
    if not out:
        raise usage_error("--out FILE is required: the new identity's credential goes there")
    (key_id, stored_key, server_key), created = _write_credential(out, name)
    request = AuthAdd(
        id=0,
        name=name,
        role=role,
        prefixes=prefixes,
        key_id=key_id,
        stored_key=stored_key,
        server_key=server_key,
    )
    count = _change(settings, out if created else None, request, f"auth add {name}")
    if settings.json:
        emit_json(
            {
                "added": {"name": name, "role": role, "prefixes": prefixes, "key_id": key_id.hex()},
                "credential_file": out,
                **_partitions(count),
            }
        )
        return
    limited = f", keys under {', '.join(prefixes)}" if prefixes else ", every key"
    say(
        f"added identity {name} ({role}{limited}); its credential is in {escape(out)} "
        f"(mode 600): use it with --secret-file {escape(out)} or DLM_SECRET_FILE"
    )


def remove(settings: Settings, name: str) -> None:
    from dlm.wire import AuthRemove

    check_name(name)
    # One id for this removal, the same on each re-send (identities.py remembers it).
    request = AuthRemove(id=0, name=name, request=os.urandom(8))
    count = _change(settings, None, request, f"auth remove {name}")
    if settings.json:
        emit_json({"removed": {"name": name}, **_partitions(count)})
        return
    say(
        f"removed identity {name}: its connections are closed and its leases are no longer "
        "renewed, so they expire at their TTL (a `dlm exec` holder stops its command first)"
    )


def _limit_value(kind: str, text: str) -> int:
    """A ``--max-KIND`` value: N (1 to the bound), or ``default`` (0: the members')."""
    from dlm.limits import IDENTITY_LIMIT_MAX

    word = text.strip().lower().replace("_", "")
    if word == DEFAULT:
        return 0
    if not word.isdigit() or not 1 <= int(word) <= IDENTITY_LIMIT_MAX:
        raise usage_error(
            f"bad --max-{kind} '{escape(text)}': use a whole number from 1 to "
            f"{IDENTITY_LIMIT_MAX}, or 'default' for the members' --identity-max-{kind}"
        )
    return int(word)


def set_limits(settings: Settings, name: str, given: dict[str, str | None], *, clear: bool) -> None:
    from dlm.wire import AuthSet

    check_name(name)
    named = {kind: text for kind, text in given.items() if text is not None}
    if clear and named:
        raise usage_error(
            "--clear puts every limit back to its default: give it alone, or name the limits"
        )
    if not clear and not named:
        raise usage_error(
            "name a limit to set (--max-leases, --max-locks, --max-connections, "
            "--max-inflight: N or 'default'), or --clear"
        )
    values = dict.fromkeys(QUOTA_KINDS, 0 if clear else -1)
    values.update({kind: _limit_value(kind, text) for kind, text in named.items()})
    request = AuthSet(id=0, name=name, **{f"max_{kind}": v for kind, v in values.items()})
    count = _change(settings, None, request, f"auth set {name}")
    changed = {f"max_{kind}": values[kind] or None for kind in QUOTA_KINDS if values[kind] >= 0}
    if settings.json:
        emit_json({"set": {"name": name, **changed}, **_partitions(count)})
        return
    said = ", ".join(
        f"--max-{key[4:]} {value if value is not None else 'default'}"
        for key, value in changed.items()
    )
    say(f"set identity {name}'s limits: {said}; the others are unchanged")


def rotate(settings: Settings, name: str, out: str | None, finish: bool) -> None:
    from dlm.wire import AuthFinish, AuthRotate

    check_name(name)
    if finish == bool(out):
        raise usage_error(
            "give --out FILE (a new key; the old one stays valid for 24 h or until --finish) "
            "or --finish (only the new key is valid from now on), not both"
            if finish
            else "rotate needs --out FILE for the new credential, or --finish"
        )
    if finish:
        count = _change(settings, None, AuthFinish(id=0, name=name), f"auth rotate {name} --finish")
        if settings.json:
            emit_json({"rotated": {"name": name, "finished": True}, **_partitions(count)})
            return
        say(f"finished the rotation of {name}: only its new key is valid now")
        return
    assert out is not None
    (key_id, stored_key, server_key), created = _write_credential(out, name)
    request = AuthRotate(
        id=0, name=name, key_id=key_id, stored_key=stored_key, server_key=server_key
    )
    count = _change(settings, out if created else None, request, f"auth rotate {name}")
    if settings.json:
        emit_json(
            {
                "rotated": {"name": name, "key_id": key_id.hex(), "finished": False},
                "credential_file": out,
                **_partitions(count),
            }
        )
        return
    say(
        f"rotated {name}: its new credential is in {escape(out)}; the old one stays valid for "
        f"24 h, or until `dlm auth rotate {name} --finish`"
    )


def list_identities(settings: Settings, output_format: str) -> None:
    def fetch(client: Client) -> dict[str, Any]:
        return {"identities": client.identities()}

    rows = _send(settings, None, fetch)["identities"]
    if output_format == JSON:
        emit_json({"identities": rows})
    elif output_format == TSV:
        emit_tsv(
            list(FIELDS),
            [
                [
                    r.get("name", ""),
                    r.get("role", ""),
                    ",".join(r.get("prefixes") or []) or "-",
                    r.get("key_id", ""),
                    "yes" if r.get("rotating") else "no",
                    "-" if r.get("old_key_until_ms") is None else r["old_key_until_ms"],
                    *(_limit_cell(r.get(field), "default") for field in LIMIT_FIELDS),
                ]
                for r in rows
            ],
        )
    else:
        print_table(
            ("NAME", "ROLE", "PREFIXES", "KEY ID", "ROTATING", "LIMITS"),
            [
                [
                    escape(str(r.get("name", ""))),
                    str(r.get("role", "")),
                    escape(", ".join(r.get("prefixes") or [])) or "(every key)",
                    str(r.get("key_id", "")),
                    "yes (old key valid until --finish or 24 h)" if r.get("rotating") else "no",
                    _limits_cell(r),
                ]
                for r in rows
            ],
        )


def _limit_cell(value: object, unset: str) -> str:
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else unset


def _limits_cell(row: dict[str, Any]) -> str:
    """The identity's own limits as `leases 2, locks 10` (``default``: none of its own)."""
    own = [
        f"{kind} {_limit_cell(row.get(f'max_{kind}'), '')}"
        for kind in QUOTA_KINDS
        if _limit_cell(row.get(f"max_{kind}"), "")
    ]
    return ", ".join(own) or "default"
