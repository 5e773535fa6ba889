"""dlm.Client's inputs read as the `dlm` command reads its flags (dlm/_api/options.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

import dlm
from dlm._api import options


@pytest.mark.parametrize(
    ("given", "expected"),
    [(30, 30.0), (1.5, 1.5), ("30s", 30.0), ("1m30s", 90.0), ("500ms", 0.5), ("2", 2.0)],
)
def test_a_duration_is_seconds_or_the_commands_text(given: float | str, expected: float) -> None:
    assert options.seconds(given, "ttl") == expected


@pytest.mark.parametrize(
    "given", ["30 parsecs", "", "-1s", -1, float("inf"), float("nan"), 8 * 86400]
)
def test_a_bad_duration_is_a_value_error_naming_the_argument(given: float | str) -> None:
    with pytest.raises(ValueError, match="wait"):
        options.seconds(given, "wait")


@pytest.mark.parametrize("given", [True, None, [30]])
def test_a_duration_of_another_type_is_a_type_error(given: object) -> None:
    with pytest.raises(TypeError):
        options.seconds(given, "ttl")  # type: ignore[arg-type]


def test_a_ttl_is_whole_milliseconds_within_the_clusters_bounds() -> None:
    assert options.ttl_ms("30s") == 30_000
    assert options.ttl_ms(1.0005) == 1001  # rounded up
    with pytest.raises(ValueError, match="ttl"):
        options.ttl_ms("10ms")
    with pytest.raises(ValueError, match="ttl"):
        options.ttl_ms(0)


def test_the_cluster_is_the_flag_text_a_list_the_variable_or_the_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("DLM_CLUSTER", raising=False)
    assert options.cluster("a:1, b:2") == ["a:1", "b:2"]
    assert options.cluster(["a:1", "b:2", "a:1"]) == ["a:1", "b:2"]
    assert options.cluster(None) == ["127.0.0.1:7700"]
    monkeypatch.setenv("DLM_CLUSTER", "c:3,d:4")
    assert options.cluster(None) == ["c:3", "d:4"]
    assert dlm.Client().cluster == ["c:3", "d:4"]  # making a client connects to nothing


@pytest.mark.parametrize("given", ["http://a:1", "a:99999", "a:notaport", ","])
def test_a_bad_cluster_is_a_value_error(given: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DLM_CLUSTER", given)
    with pytest.raises(ValueError):
        options.cluster(given)


def test_keys_are_checked_and_kept_once_in_order() -> None:
    assert options.keys("a") == ("a",)
    assert options.keys(["b", "a", "b"]) == ("b", "a")
    with pytest.raises(ValueError):
        options.keys([])
    with pytest.raises(ValueError):
        options.keys("bad\nkey")
    with pytest.raises(TypeError):
        options.keys([1])  # type: ignore[list-item]


def test_meta_records_the_owner_under_the_callers_entries() -> None:
    meta = options.meta({"job": "nightly", "host": "elsewhere"})
    assert meta["job"] == "nightly" and meta["host"] == "elsewhere"
    assert {"user", "pid"} <= set(meta)
    with pytest.raises(ValueError):
        options.meta({f"k{i}": "v" for i in range(40)})


def test_no_credentials_load_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in ("DLM_SECRET_FILE", "DLM_TLS_CA", "DLM_TLS_CERT", "DLM_TLS_KEY"):
        monkeypatch.delenv(variable, raising=False)
    assert options.credentials(None, None, None, None) == (None, None)


def test_a_secret_file_that_cannot_be_used_is_auth_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(dlm.AuthFailed, match="nope"):
        dlm.Client("127.0.0.1:1", secret_file=str(missing))
    monkeypatch.setenv("DLM_SECRET_FILE", str(missing))  # read as the command reads it
    with pytest.raises(dlm.AuthFailed, match="DLM_SECRET_FILE"):
        dlm.Client("127.0.0.1:1")
    monkeypatch.delenv("DLM_SECRET_FILE")
    with pytest.raises(dlm.AuthFailed, match="tls"):
        dlm.AsyncClient("127.0.0.1:1", tls_cert=str(missing))


def test_lock_arguments_are_checked_when_the_lock_is_made() -> None:
    client = dlm.Client("127.0.0.1:1")
    with pytest.raises(ValueError, match="ttl"):
        client.lock("k", ttl="forever")
    with pytest.raises(ValueError, match="limit"):
        client.semaphore("k", limit=0)
    lock = client.lock(["a", "b"], ttl=5, wait=None, meta={"job": "x"})
    assert (lock.key, lock.keys, lock.limit, lock.meta["job"]) == ("a", ("a", "b"), 1, "x")
    assert not lock.owned() and lock.time_left() == 0.0 and lock.deadline == 0.0
    with pytest.raises(dlm.LockLost, match="not held"):
        lock.check()
    with pytest.raises(RuntimeError):
        _ = lock.token
    with pytest.raises(RuntimeError):
        lock.release()


def test_a_locks_trace_context_is_checked_when_the_lock_is_made() -> None:
    good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    client = dlm.Client("127.0.0.1:1")
    try:
        assert client.lock("k", traceparent=good)._traceparent == good
        with pytest.raises(ValueError, match="bad traceparent '00-xyz'"):
            client.lock("k", traceparent="00-xyz")
        with pytest.raises(ValueError, match="bad traceparent"):
            client.semaphore("k", 2, traceparent="nonsense")
    finally:
        client.close()
