"""Exit codes of the `dlm` command and the one error type its commands raise.

Scripts branch on these numbers, so they are a contract (README, `dlm --help`):
they follow sysexits.h where a code there fits. 1 means one thing only, a
check that found something wrong (`dlm status --check`: degraded; `dlm store
inspect`: a damaged data directory; `dlm snapshot inspect`: not an intact backup),
so a bug in dlm is 70, never 1, which a
command run by `dlm exec` uses for its own failures.
"""

from __future__ import annotations

# typing stays off the CLI's import path (milliseconds per run); mypy reads TYPE_CHECKING as true.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

OK = 0
CHECK_FAILED = 1  # status/runs --check: degraded/missing; store/snapshot inspect: problems
USAGE = 2
UNAVAILABLE = 69  # EX_UNAVAILABLE
INTERNAL = 70  # EX_SOFTWARE: a bug in dlm, or a reply it does not understand
CANT_CREATE = 73  # EX_CANTCREAT: snapshot save cannot write its FILE
CONFLICT = 75  # EX_TEMPFAIL: try again later
LOST = 77  # EX_NOPERM: not (or no longer) the holder
CONFIG = 78  # EX_CONFIG: the secret or TLS files do not work with the cluster
NOT_EXECUTABLE = 126  # as shells report it
NOT_FOUND = 127
BROKEN_PIPE = 141  # 128 + SIGPIPE, as for any program whose reader went away

EXIT_CODE_HELP = """\
Exit codes:

\b
  0   success (for exec: CMD exited 0)
  1   status --check: the cluster is degraded (runs --check: no run ended
      within --max-age; store inspect: damaged data; snapshot inspect, node
      restore: not an intact backup)
  2   usage error (members: an id or address in use, an unknown id, the last
      voter, a removal that would leave no quorum of answering voters; node
      recover without --force)
  69  cluster unavailable: no member answered within --dial-timeout, or no
      quorum within --timeout (watch, observe: no member served the watch
      for --timeout)
  70  internal error (a bug in dlm: please report it)
  73  snapshot save: FILE cannot be written (no permission, disk full)
  75  lock held by someone else and not obtained (immediately, or within --wait);
      members: another membership change is still pending (retry)
  77  lease lost, or not the holder (renew or release of an expired lease,
      release of a grant the lease no longer holds, revoke of a lease that is
      gone; exec's lock lost while CMD ran); or not permitted: the identity of
      --secret-file may not do this (PERMISSION_DENIED), or is at one of its
      quotas (QUOTA_EXCEEDED)
  78  authentication or TLS failed, or their files cannot be used: set
      --secret-file/DLM_SECRET_FILE or --tls-ca/DLM_TLS_CA as the message says
  N   exec only: CMD's own exit code; 128+N when CMD was killed by signal N
"""


class CliError(Exception):
    """A failure to report as one line (or one JSON object) and an exit code.

    ``code`` is the machine-readable name put in ``{"error": {"code": ...}}``:
    the protocol's error code where the cluster gave one, else one of ours
    (USAGE, NOT_FOUND, INTERNAL, ...). ``details`` are extra fields for JSON.
    """

    def __init__(self, code: str, message: str, exit_code: int, **details: Any) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.exit_code = exit_code
        self.details = details
        self.reported = False  # set when the JSON object already went out with more fields

    def to_json(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message, **self.details}}


class Interrupted(BaseException):
    """dlm got a terminating signal; the command cleans up and exits 128 + ``signum``."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def usage_error(message: str) -> CliError:
    return CliError("USAGE", message, USAGE)


def from_client_error(exc: Exception) -> CliError:
    """Wraps an error of dlm.client, keeping its code, message and exit code."""
    code = str(getattr(exc, "code", "ERROR"))
    message = str(getattr(exc, "message", "") or exc)
    exit_code = int(getattr(exc, "exit_code", INTERNAL))
    if exit_code == CHECK_FAILED:
        # The client's catch-all (an error code it does not know) is a software
        # problem to us; 1 belongs to --check and to the command exec runs.
        exit_code = INTERNAL
    details: dict[str, Any] = {}
    holders = getattr(exc, "holders", None)
    if holders is not None:
        details["holders"] = holders
    retry_after = getattr(exc, "retry_after_ms", None)
    if retry_after is not None:
        details["retry_after_ms"] = retry_after
    return CliError(code, message, exit_code, **details)
