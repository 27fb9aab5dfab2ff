"""Whether `fab train` restarts a failed launch: the first failure retryable and restarts left."""

from __future__ import annotations

from collections.abc import Callable

from launcher.launch.monitor import RunFailed
from launcher.recover.classify import classify


def restart_cause(error: RunFailed, attempt: int, max_restarts: int, say: Callable[[str], None]) -> str | None:
    """The cause to log and record when restart number attempt + 1 is due; None when the run ends here.
    An operator's interrupt (no first failure) is never retried; a program error is named as such."""
    if error.failure is None:
        return None
    verdict = classify(error.failure)
    if not verdict.retry:
        say(f"not restarting: {verdict.cause}")
        return None
    if attempt >= max_restarts:
        say(f"not restarting: {verdict.cause}, and --max-restarts {max_restarts} restart(s) are used up")
        return None
    return verdict.cause
