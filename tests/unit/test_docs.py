"""The operator's documents agree with the code.

README.md's "Metrics" table lists every metric a member serves (name, type,
labels), its "Audit trail" section every event the node machine logs for it,
and README.md as a whole every environment variable dlm reads;
docs/grafana-dashboard.json asks only for metrics that exist; the node flags
table lists each flag once; docs/dlm.service restarts a member only on the exit
code a restart can fix, and `systemd-analyze verify` accepts it where systemd is
installed.
"""

from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dlm.node.runtime.config.options import ALL_OPTIONS
from dlm.node.runtime.metrics import METRIC_HELP

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DASHBOARD = REPO / "docs" / "grafana-dashboard.json"

_METRIC_ROW = re.compile(r"^\| `([a-z_]+)` \| (counter|gauge|histogram) \|([^|]*)\|", re.M)
_HISTOGRAM_SERIES = ("_bucket", "_sum", "_count")
STANDARD_VARIABLES = {"USER", "LOGNAME"}
"""Read by dlm, set by the system: not dlm's to document."""


def readme_section(title: str) -> str:
    """The text of README.md's ``## title`` section, up to the next ``## ``."""
    text = README.read_text(encoding="utf-8")
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def readme_metrics() -> dict[str, tuple[str, tuple[str, ...]]]:
    """README's metric table: name -> (type, label names)."""
    rows = _METRIC_ROW.findall(readme_section("Metrics"))
    return {name: (kind, tuple(re.findall(r"`([a-z_]+)`", labels))) for name, kind, labels in rows}


def test_the_readme_lists_every_metric_and_no_other() -> None:
    documented = readme_metrics()
    assert {name for name in documented if name.startswith("dlm_")} == set(METRIC_HELP)
    for name, (kind, _) in documented.items():
        assert name.endswith("_total") == (kind == "counter"), name


def test_the_readme_has_an_example_line_for_every_audit_event() -> None:
    section = readme_section("Audit trail")
    # The node machine and the rooms it is split into log through their outbox.
    machine = "\n".join(
        path.read_text(encoding="utf-8") for path in sorted((REPO / "dlm" / "node").glob("*.py"))
    )
    logged = set(re.findall(r'\.log\(\s*"(?:info|warning|error|debug)",\s*"([a-z_]+)"', machine))
    logged |= set(re.findall(r'reject\(now, "([a-z_]+)"', machine))
    assert len(logged) >= 15, logged
    examples = {}
    for line in section.splitlines():
        if line.startswith('{"time":'):
            record = json.loads(line)
            examples[record["event"]] = record
    assert logged <= set(examples), logged - set(examples)
    for event in logged:
        assert f"`{event}`" in section, f"{event} has an example but no description"


def _variables_read(path: Path) -> set[str]:
    """Names passed to os.environ.get / os.environ[...] in one module, constants resolved."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    constants = {
        target.id: node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
        for target in node.targets
        if isinstance(target, ast.Name) and isinstance(node.value.value, str)
    }
    names: set[str] = set()

    def is_environ(node: ast.AST) -> bool:
        return isinstance(node, ast.Attribute) and node.attr == "environ"

    for node in ast.walk(tree):
        argument: ast.AST | None = None
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get"
            and is_environ(node.func.value)
            and node.args
        ):
            argument = node.args[0]
        elif isinstance(node, ast.Subscript) and is_environ(node.value):
            argument = node.slice
        if isinstance(argument, ast.Constant) and isinstance(argument.value, str):
            names.add(argument.value)
        elif isinstance(argument, ast.Name) and argument.id in constants:
            names.add(constants[argument.id])
    return names


def test_every_environment_variable_dlm_reads_is_documented() -> None:
    read: set[str] = set()
    for path in (REPO / "dlm").rglob("*.py"):
        read |= _variables_read(path)
    read |= {option.env for option in ALL_OPTIONS}
    assert {"DLM_LOG_LEVEL", "DLM_NO_FSYNC", "NOTIFY_SOCKET", "DLM_NODE_METRICS_LISTEN"} <= read
    readme = README.read_text(encoding="utf-8")
    undocumented = sorted(n for n in read - STANDARD_VARIABLES if f"`{n}" not in readme)
    assert not undocumented, f"README.md does not mention {undocumented}"


def _expressions(item: Any) -> list[str]:
    if isinstance(item, dict):
        found = [item["expr"]] if isinstance(item.get("expr"), str) else []
        if isinstance(item.get("query"), str):
            found.append(item["query"])
        for value in item.values():
            found.extend(_expressions(value))
        return found
    if isinstance(item, list):
        return [e for value in item for e in _expressions(value)]
    return []


def _panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for panel in dashboard["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))
    return out


def test_the_dashboard_uses_only_metrics_that_exist() -> None:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    expressions = _expressions(dashboard)
    assert len(expressions) >= 12
    used = set()
    for expr in expressions:
        for name in re.findall(r"\b(dlm_[a-z_]+|process_[a-z_]+)\b", expr):
            base = name
            for suffix in _HISTOGRAM_SERIES:
                if name.endswith(suffix) and name.removesuffix(suffix) in METRIC_HELP:
                    base = name.removesuffix(suffix)
            used.add(base)
    known = set(METRIC_HELP) | set(readme_metrics())  # and the documented process_* ones
    unknown = sorted(name for name in used if name not in known)
    assert not unknown, f"the dashboard asks for metrics no member serves: {unknown}"
    wanted = {
        "dlm_raft_role",
        "dlm_raft_term",
        "dlm_requests_total",
        "dlm_grants_total",
        "dlm_lease_expiries_total",
        "dlm_locks_held",
        "dlm_waiters",
        "dlm_sessions",
        "dlm_acquire_wait_seconds",
        "dlm_hold_seconds",
        "dlm_fsync_seconds",
        "dlm_peer_append_rtt_seconds",
        "dlm_peer_reachable",
        "dlm_client_connections",
    }
    assert wanted <= used, wanted - used


def test_the_dashboard_is_well_formed() -> None:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    panels = _panels(dashboard)
    ids = [panel["id"] for panel in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in panels:
        assert panel.get("title"), panel
        if panel["type"] == "row":
            continue
        assert panel["targets"], panel["title"]
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        for target in panel["targets"]:
            assert target["refId"] and target["expr"].strip(), panel["title"]
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert dashboard["uid"] and dashboard["title"] and dashboard["schemaVersion"] >= 36


def test_the_node_flags_table_lists_each_flag_once() -> None:
    section = readme_section("Running a cluster")
    flags = re.findall(r"^\| `(--[a-z-]+)", section, re.M)
    assert len(flags) == len(set(flags)), sorted(f for f in flags if flags.count(f) > 1)
    assert set(flags) == {option.flag for option in ALL_OPTIONS}


UNIT = REPO / "docs" / "dlm.service"


def unit_settings() -> dict[str, list[str]]:
    """docs/dlm.service's settings: name -> every value it is given, in order."""
    settings: dict[str, list[str]] = {}
    for line in UNIT.read_text(encoding="utf-8").splitlines():
        if line.startswith(("#", "[")) or "=" not in line:
            continue
        name, _, value = line.partition("=")
        settings.setdefault(name.strip(), []).append(value.strip())
    return settings


def test_the_systemd_unit_restarts_only_what_a_restart_can_fix() -> None:
    from dlm.node.runtime.main import EXIT_CONFIG, EXIT_FAILURE, EXIT_FOREIGN_DATA, EXIT_USAGE

    settings = unit_settings()
    assert settings["Restart"] == ["on-failure"]
    prevented = {
        int(code) for value in settings["RestartPreventExitStatus"] for code in value.split()
    }
    assert prevented == {EXIT_USAGE, EXIT_FOREIGN_DATA, EXIT_CONFIG}
    assert EXIT_FAILURE not in prevented
    # Every Documentation= must point at something that exists once dlm is installed:
    # nothing installs the README at a fixed path, so the unit names none.
    assert "Documentation" not in settings


def test_systemd_analyze_verifies_the_unit(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (apt-get install systemd)")
    # `verify` checks that ExecStart's program exists: point it at this tree's dlm.
    dlm = Path(sys.executable).parent / "dlm"
    if not dlm.exists():
        pytest.skip(f"no dlm beside {sys.executable} to stand for /usr/local/bin/dlm")
    unit = tmp_path / "dlm.service"
    unit.write_text(
        UNIT.read_text(encoding="utf-8").replace("/usr/local/bin/dlm", str(dlm)), encoding="utf-8"
    )
    done = subprocess.run(
        [analyze, "verify", str(unit)], capture_output=True, text=True, timeout=60, check=False
    )
    # Its complaints about the unit name the unit; other lines are about the machine
    # the test runs on (no system bus in a container, say).
    about_the_unit = [line for line in done.stderr.splitlines() if "dlm.service" in line]
    assert done.returncode == 0 and not about_the_unit, done.stderr
