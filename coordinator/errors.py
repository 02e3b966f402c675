"""The coordinator's one error type."""


class CoordinatorError(RuntimeError):
    """The coordinator cannot run (e.g. another one owns the run, or Redis lost the run's state)."""
