"""The settings of `dlm node start`, declared once: flag, environment variable, config-file key.

Each ``NodeOption`` below becomes a flag of `dlm node start` (and of
``python -m dlm.node.runtime.main``), an environment variable (``DLM_NODE_`` and the
flag's name: ``--cluster-id`` is ``DLM_NODE_CLUSTER_ID``) and a key of the
TOML file named by ``--config`` (the flag's name without the dashes:
``cluster-id = "prod"``). A new setting gets all three by one line in
``NODE_OPTIONS``.

``resolve`` merges them: a flag wins over its variable, a variable over the
file. An unknown key in the file, or an unknown ``DLM_NODE_*`` variable, is
an error naming it, because a misspelt setting silently ignored is how a
member ends up in the wrong cluster.

Cheap to import (the typer app builds the command from this table on every
run): tomllib is loaded only when there is a file to read.
"""

from __future__ import annotations

# typing stays off the CLI's import path (milliseconds per run); mypy reads TYPE_CHECKING as true.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

ENV_PREFIX = "DLM_NODE_"
LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("json", "text")


class OptionError(Exception):
    """A setting is unknown or malformed; the message is one line naming where it came from."""


class NodeOption:
    """One setting: ``param`` is its keyword in dlm.node.runtime.main.start_node."""

    __slots__ = ("_env", "choices", "flag", "help", "is_flag", "metavar", "param")

    def __init__(
        self,
        param: str,
        flag: str,
        metavar: str,
        help: str,
        choices: tuple[str, ...] = (),
        *,
        is_flag: bool = False,
        env: str | None = None,
    ) -> None:
        self.param = param
        self._env = env
        self.flag = flag
        self.metavar = metavar
        self.help = help
        self.choices = choices
        self.is_flag = is_flag
        """A switch without a value: given, its value is "true" (a variable or file key
        may also say true or false)."""

    @property
    def name(self) -> str:
        return self.flag.removeprefix("--")

    @property
    def env(self) -> str:
        if self._env is not None:
            return self._env
        return ENV_PREFIX + self.name.replace("-", "_").upper()

    def __repr__(self) -> str:
        return f"NodeOption({self.flag})"


NODE_OPTIONS = (
    NodeOption("node_id", "--id", "ID", "This member's id. [default: n1]"),
    NodeOption(
        "listen",
        "--listen",
        "HOST:PORT",
        "Address to serve clients and peers. [default: this member's address in --peers]",
    ),
    NodeOption(
        "peers",
        "--peers",
        "ID=HOST:PORT,...",
        "Every member of the cluster, this one included. [default: this member alone]",
    ),
    NodeOption("data", "--data", "DIR", "Data directory. [default: ./dlm-data]"),
    NodeOption("cluster", "--cluster-id", "NAME", "The cluster's name. [default: dlm]"),
    NodeOption(
        "log_level",
        "--log-level",
        "|".join(LOG_LEVELS),
        "Least severe events to log. [default: $DLM_LOG_LEVEL, else info]",
        LOG_LEVELS,
    ),
    NodeOption(
        "log_format",
        "--log-format",
        "|".join(LOG_FORMATS),
        "JSON lines, or one readable line per event. [default: text on a terminal, else json]",
        LOG_FORMATS,
    ),
    NodeOption(
        "join",
        "--join",
        "ADDR[,ADDR...]",
        "Join a running cluster: ask these members to add this one (first start only).",
    ),
    NodeOption(
        "advertise",
        "--advertise",
        "HOST:PORT",
        "The address other members and clients reach this one at. [default: --listen]",
    ),
    NodeOption(
        "auto_promote",
        "--auto-promote",
        "on|off",
        "The leader makes a caught-up learner a voter by itself. [default: on]",
        ("on", "off"),
    ),
    NodeOption(
        "metrics_listen",
        "--metrics-listen",
        "HOST:PORT",
        "Serve Prometheus metrics at http://HOST:PORT/metrics. Beyond the loopback range "
        "scrapers must authenticate: --metrics-token-file, or the member's TLS (a client "
        "certificate the --tls-ca signed); or --insecure to serve anyone. [default: off]",
    ),
    NodeOption(
        "metrics_token_file",
        "--metrics-token-file",
        "PATH",
        "Scrapers must send this file's token as `Authorization: Bearer` (mode 600; make "
        "it with `dlm secret new --out PATH`; Prometheus: authorization.credentials_file). "
        "[default: off]",
    ),
    NodeOption(
        "job_metrics",
        "--job-metrics",
        "PREFIX",
        "While leading, export the run ledger of the keys under PREFIX as dlm_job_* "
        "metrics (one series set per key, at most 1000 keys). [default: off]",
    ),
    NodeOption(
        "election_timeout",
        "--election-timeout",
        "DURATION",
        "How long a follower goes without hearing a leader before it stands (each wait is "
        "drawn between this and twice it, longer after failed elections and on a slow "
        "disk); 150ms to 60s, rounded to 50ms. Give every member the same. [default: 300ms]",
    ),
    NodeOption(
        "max_leases",
        "--max-leases",
        "N",
        "Most live leases the cluster accepts (QUOTA_EXCEEDED beyond). [default: 200000]",
    ),
    NodeOption(
        "max_locks",
        "--max-locks",
        "N",
        "Most held locks and queued waiters, together. [default: 2000000]",
    ),
    NodeOption(
        "max_meta_bytes",
        "--max-meta-bytes",
        "N",
        "Most bytes of owner metadata per lock or lease. [default: 4096]",
    ),
    NodeOption(
        "max_connections",
        "--max-connections",
        "N",
        "Most client connections at once; peers always get in. "
        "[default: 8192, fewer if the open-files limit is lower]",
    ),
    NodeOption(
        "identity_max_leases",
        "--identity-max-leases",
        "N",
        "Most live leases one client identity may own, unless an admin set its own "
        "(QUOTA_EXCEEDED naming the identity beyond). [default: half of --max-leases]",
    ),
    NodeOption(
        "identity_max_locks",
        "--identity-max-locks",
        "N",
        "Most held locks and queued waits of one identity's leases, together. "
        "[default: half of --max-locks]",
    ),
    NodeOption(
        "identity_max_connections",
        "--identity-max-connections",
        "N",
        "Most client connections one identity may have to this member. "
        "[default: 3/4 of the member's client connections]",
    ),
    NodeOption(
        "identity_max_inflight",
        "--identity-max-inflight",
        "N",
        "Most requests one client connection may have sent and not yet had answered. "
        "[default: 512]",
    ),
    NodeOption(
        "partitions",
        "--partitions",
        "P",
        "Split the keys over P Raft groups (1 to 64), each served by a process of its own "
        "on every member; fixed when the data directory is created (a later start without "
        "it uses the recorded count). Give every member the same. [default: 1]",
    ),
    NodeOption(
        "peer_secret_file",
        "--peer-secret-file",
        "PATH",
        "Peers must prove they hold the secret in this file (mode 600; make it with "
        "`dlm secret new --out PATH`). [default: off]",
    ),
    NodeOption(
        "client_secret_file",
        "--client-secret-file",
        "PATH",
        "Clients must prove they hold the secret in this file (their --secret-file). "
        "[default: off]",
    ),
    NodeOption(
        "tls_cert", "--tls-cert", "PATH", "This member's TLS certificate (PEM). [default: no TLS]"
    ),
    NodeOption("tls_key", "--tls-key", "PATH", "Its unencrypted private key (PEM)."),
    NodeOption(
        "tls_ca",
        "--tls-ca",
        "PATH",
        "The CA that signs every member's certificate; peers must present one naming "
        "their member id.",
    ),
    NodeOption(
        "insecure",
        "--insecure",
        "",
        "Listen beyond the loopback range without authenticating peers (any host that can "
        "connect may speak for a member).",
        is_flag=True,
    ),
)
"""Settings that may come from a flag, the environment or the config file."""

CONFIG_OPTION = NodeOption(
    "config",
    "--config",
    "PATH",
    'A TOML file of these settings, keyed by flag name (listen = "10.0.0.1:7700"). '
    "SIGHUP re-reads it and applies what can change live (README: Changing settings).",
)
"""Where the file is: a flag or a variable, not a key of the file itself."""

ALL_OPTIONS = (*NODE_OPTIONS, CONFIG_OPTION)


class Resolved:
    """The merged settings: ``values[param]`` (None: not set anywhere) and, for each value
    set, ``sources[param]``: the flag, the variable, or 'FILE: key'."""

    __slots__ = ("sources", "values")

    def __init__(self, values: dict[str, str | None], sources: dict[str, str]) -> None:
        self.values = values
        self.sources = sources

    def explain(self, message: str) -> str:
        """``message`` (which names a flag) plus where that flag's value came from, when it
        was not the flag itself."""
        for option in NODE_OPTIONS:
            source = self.sources.get(option.param)
            if source and source != option.flag and option.flag in message:
                return f"{message} (the value comes from {source})"
        return message


def resolve(flags: Mapping[str, str | None], environ: Mapping[str, str]) -> Resolved:
    """Flag over environment over config file, for every option in NODE_OPTIONS."""
    known = {option.env for option in ALL_OPTIONS}
    unknown = sorted(name for name in environ if name.startswith(ENV_PREFIX) and name not in known)
    if unknown:
        raise OptionError(
            f"unknown environment variable {', '.join(unknown)}: dlm node reads "
            f"{', '.join(sorted(known))}"
        )
    config_path, config_source = _pick(CONFIG_OPTION, flags, environ)
    from_file = read_config(config_path, config_source) if config_path else {}
    values: dict[str, str | None] = {}
    sources: dict[str, str] = {}
    for option in NODE_OPTIONS:
        value, source = _pick(option, flags, environ)
        if value is None and option.name in from_file:
            value, source = from_file[option.name], f"{config_path}: {option.name}"
        if value is not None and option.choices and value not in option.choices:
            raise OptionError(f"{source}: {value!r} is not one of {', '.join(option.choices)}")
        values[option.param] = value
        if source is not None:
            sources[option.param] = source
    return Resolved(values, sources)


def _pick(
    option: NodeOption, flags: Mapping[str, str | None], environ: Mapping[str, str]
) -> tuple[str | None, str | None]:
    flag = flags.get(option.param)
    if flag is not None:
        return flag, option.flag
    # An empty variable counts as unset, as it does for most tools (FOO= cmd).
    from_env = environ.get(option.env)
    if from_env:
        return from_env, option.env
    return None, None


def read_config(path: str, source: str | None) -> dict[str, str]:
    """The settings in a TOML file: string values under the flags' names."""
    import tomllib

    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise OptionError(f"{source or '--config'}: {path} does not exist") from None
    except OSError as exc:
        raise OptionError(f"cannot read {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise OptionError(f"{path} is not valid TOML: {exc}") from None
    names = [option.name for option in NODE_OPTIONS]
    unknown = sorted(key for key in data if key not in names)
    if unknown:
        raise OptionError(
            f"{path}: unknown key{'s' if len(unknown) > 1 else ''} "
            f"{', '.join(repr(k) for k in unknown)}; the keys are {', '.join(names)}"
        )
    settings = {}
    flags = {option.name for option in NODE_OPTIONS if option.is_flag}
    for key, value in data.items():
        if key in flags and isinstance(value, bool):
            settings[key] = "true" if value else "false"
            continue
        if not isinstance(value, str):
            raise OptionError(
                f'{path}: {key} must be a string, as on the command line ({key} = "...")'
            )
        settings[key] = value
    return settings
