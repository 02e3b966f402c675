"""The coordinator's error types."""


class CoordinatorError(RuntimeError):
    """The coordinator cannot run (e.g. another one owns the run, or Redis lost the run's state)."""


class RunLost(CoordinatorError):
    """Mid-run, Redis no longer holds this coordinator's run (wiped, flushed, restarted without
    persistence) or another coordinator took it over: the wrap-up leaves Redis alone."""
