"""The rules on what a key, a lease id, a TTL, a limit or owner metadata may be.

One place for them, because three rooms enforce them: the ``dlm`` command
(before it connects, naming the option), the member (the wire decoder refuses
malformed keys, ids and metadata, and the leader refuses a command out of
range before proposing it) and the lock state machine (a bad command in the
log changes nothing). Each ``check_*`` returns None when the value is fine,
or a sentence a user can act on, worded without option names so each caller
can put its own in front.

Cheap to import: the CLI's fast path loads it on every run.
"""

from __future__ import annotations

# typing stays off the CLI's import path (milliseconds per run); mypy reads TYPE_CHECKING as true.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

KEY_MAX_BYTES = 512
"""A key is 1 to 512 bytes of UTF-8 text without control characters."""
LEASE_ID_MAX_CHARS = 64
LEASE_ID_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-"
CLIENT_ID_MAX_CHARS = 64
"""Client ids (one per client process, for request deduplication) use the lease id alphabet."""
IDENTITY_MAX_CHARS = 128
"""An identity (who a client connection authenticated as): printable text, "" for none."""
TTL_MIN_MS = 1_000
TTL_MAX_MS = 86_400_000
HOLD_MAX_MS = 86_400_000
"""A lease's TTL may be set below TTL_MIN_MS only to finish a minimum hold; never above a day."""
LIMIT_MAX = 1024
META_MAX_ENTRIES = 16
META_NAME_MAX_CHARS = 64
META_VALUE_MAX_CHARS = 256
INT_MAX = 2**63 - 1
"""Every integer on the wire and in the log fits in a signed 64-bit field."""


def is_control(ch: str) -> bool:
    """C0, DEL, C1 and lone surrogates: characters a key or a name may not contain."""
    code = ord(ch)
    return code < 0x20 or 0x7F <= code <= 0x9F or 0xD800 <= code <= 0xDFFF


def has_control(text: str) -> bool:
    """Does ``text`` hold a character ``is_control`` refuses? Printable ASCII, the usual
    case, is answered without a Python loop over the characters (the leader checks every
    key it is asked for)."""
    if text.isascii():
        return not text.isprintable()  # ASCII's unprintables are exactly C0 and DEL
    return any(is_control(ch) for ch in text)


def check_key(key: str) -> str | None:
    if not key:
        return "a lock key must not be empty"
    size = len(key.encode("utf-8", "surrogatepass"))
    if size > KEY_MAX_BYTES:
        return f"a lock key is at most {KEY_MAX_BYTES} bytes of UTF-8; this one has {size}"
    if has_control(key):
        return "a lock key must be printable text (it contains a control character)"
    return None


def check_lease_id(lease: str) -> str | None:
    if 1 <= len(lease) <= LEASE_ID_MAX_CHARS and not lease.strip(LEASE_ID_ALPHABET):
        return None
    return (
        f"a lease id is 1 to {LEASE_ID_MAX_CHARS} characters of A-Z, a-z, 0-9, '_' or '-'; "
        f"got {lease[:80]!r}"
    )


def check_client_id(client: str) -> str | None:
    if 1 <= len(client) <= CLIENT_ID_MAX_CHARS and not client.strip(LEASE_ID_ALPHABET):
        return None
    return f"a client id is 1 to {CLIENT_ID_MAX_CHARS} characters of A-Z, a-z, 0-9, '_' or '-'"


def check_identity(identity: str) -> str | None:
    """An identity as the log and the state machine keep it: "" (none) or 1 to
    ``IDENTITY_MAX_CHARS`` printable characters."""
    if len(identity) <= IDENTITY_MAX_CHARS and not has_control(identity):
        return None
    return f"an identity is at most {IDENTITY_MAX_CHARS} printable characters"


def check_ttl_ms(ttl_ms: int, as_written: str | None = None) -> str | None:
    """``as_written``: the value as the user typed it (``48h``), shown instead of the
    milliseconds, so the message quotes what they wrote."""
    if TTL_MIN_MS <= ttl_ms <= TTL_MAX_MS:
        return None
    shown = _ms(ttl_ms) if as_written is None else as_written.strip()
    return f"a lease TTL must be between 1s and 24h (got {shown})"


LOCK_DELAY_MAX_MS = 60_000
"""The longest lock-delay a lease may ask for (issue 27: at most a minute)."""


def check_lock_delay_ms(delay_ms: int, as_written: str | None = None) -> str | None:
    """A lease's lock-delay: 0 (none) up to a minute."""
    if 0 <= delay_ms <= LOCK_DELAY_MAX_MS:
        return None
    shown = _ms(delay_ms) if as_written is None else as_written.strip()
    return f"a lock-delay must be between 0s and 60s (got {shown})"


def check_hold_ms(ttl_ms: int) -> str | None:
    """The TTL a lease may be given to finish a minimum hold: 1 ms up to a day."""
    if 1 <= ttl_ms <= HOLD_MAX_MS:
        return None
    return f"a remaining hold must be between 1ms and 24h (got {_ms(ttl_ms)})"


def check_limit(limit: int) -> str | None:
    if 1 <= limit <= LIMIT_MAX:
        return None
    return f"a limit must be between 1 (exclusive lock) and {LIMIT_MAX} (got {limit})"


def check_meta(meta: Mapping[str, str]) -> str | None:
    if len(meta) > META_MAX_ENTRIES:
        return f"owner metadata holds at most {META_MAX_ENTRIES} entries (got {len(meta)})"
    for name, value in meta.items():
        if not 1 <= len(name) <= META_NAME_MAX_CHARS or has_control(name):
            return (
                f"a metadata name is 1 to {META_NAME_MAX_CHARS} printable characters "
                f"(got {name[:80]!r})"
            )
        if len(value) > META_VALUE_MAX_CHARS or (
            not value.isascii() and any(0xD800 <= ord(ch) <= 0xDFFF for ch in value)
        ):
            return f"the metadata value of {name!r} is at most {META_VALUE_MAX_CHARS} characters"
    return None


def check_seq(seq: int) -> str | None:
    if 0 <= seq <= INT_MAX:
        return None
    return "a request sequence number is between 0 and 2**63-1"


def _ms(ms: int) -> str:
    if ms % 1000 == 0 and abs(ms) >= 1000:
        return f"{ms // 1000}s"
    return f"{ms}ms"


IDENTITY_NAME_MAX = 64
"""The longest identity name (``dlm auth add NAME``)."""
IDENTITY_PREFIXES_MAX = 32
"""The most key prefixes one identity has."""
IDENTITY_LIMIT_MAX = 1_000_000_000
"""The highest per-identity quota an admin may set (``dlm auth set NAME --max-leases N``):
above every cluster cap, so the cluster's own caps are what binds then."""
REQUEST_ID_MAX_BYTES = 16
"""The longest request id a client puts on a change it may re-send (``auth_remove``)."""


_IDENTITY_NAME_ALPHABET = LEASE_ID_ALPHABET.replace("_-", "") + "._-"
"""ASCII letters and digits, '.', '_' and '-': an identity name's characters (checked
without a Python loop over them: every applied entry names its identity)."""


def check_identity_name(name: str) -> str | None:
    """Why ``name`` is not an identity name (None: it is one): 1 to 64 letters, digits,
    '.', '_' and '-', starting with a letter or digit."""
    if not 1 <= len(name) <= IDENTITY_NAME_MAX:
        return f"an identity name is 1 to {IDENTITY_NAME_MAX} characters"
    if not name[0].isascii() or not name[0].isalnum():
        return f"identity name {name[:80]!r} must start with a letter or digit"
    if name.strip(_IDENTITY_NAME_ALPHABET):  # what is left holds another character
        return f"identity name {name[:80]!r} may hold only letters, digits, '.', '_' and '-'"
    return None


def check_identity_limit(value: int) -> str | None:
    """Why ``value`` is not a per-identity quota setting (None: it is): 1 to
    IDENTITY_LIMIT_MAX, or 0 (the members' default) or -1 (unchanged) in a change."""
    if type(value) is not int or not -1 <= value <= IDENTITY_LIMIT_MAX:
        return f"a per-identity limit is a whole number from 1 to {IDENTITY_LIMIT_MAX}"
    return None


def check_identity_prefixes(prefixes: tuple[str, ...] | list[str]) -> str | None:
    """Why these key prefixes are not an identity's (None: they are): at most 32, each
    1 to KEY_MAX_BYTES bytes of printable text."""
    if len(prefixes) > IDENTITY_PREFIXES_MAX:
        return f"an identity has at most {IDENTITY_PREFIXES_MAX} prefixes"
    for prefix in prefixes:
        size = len(prefix.encode("utf-8", "surrogatepass"))
        if not 1 <= size <= KEY_MAX_BYTES or not prefix.isprintable():
            return f"a key prefix is 1 to {KEY_MAX_BYTES} bytes of printable text"
    return None
