"""The one exception type for user-facing failures.

`OffloadError` carries a message that names the offending file or tensor and says how to fix it.
The command line prints it without a traceback and exits with status 1; any other exception is a
bug and keeps its traceback.
"""

from __future__ import annotations

__all__ = ["OffloadError", "UnknownOption"]


class OffloadError(Exception):
    """A failure caused by the user's input (file, plan, option or machine), not by a bug."""

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        self.message = message
        self.hint = hint
        super().__init__(message if hint is None else f"{message}\n  fix: {hint}")

    def restate(self, message: str, hint: str | None) -> None:
        """Say the same failure in other words (the Python API's keywords for the command line's options)."""
        self.message, self.hint = message, hint
        self.args = (message if hint is None else f"{message}\n  fix: {hint}",)


class UnknownOption(OffloadError, TypeError):
    """A keyword a library call does not take (a ``TypeError`` too, as Python raises for one)."""
