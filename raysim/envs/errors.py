"""The errors of building an env from a config (a wrong id, an option the env does not take, a package not installed)
and of asking an env for what it cannot do (pictures)."""

from __future__ import annotations


class UnknownEnvError(ValueError):
    """An env id that names no registered task, importable class or Gymnasium id."""


class EnvOptionError(ValueError):
    """An option the env does not take; ``key`` names it."""

    def __init__(self, message: str, key: str):
        super().__init__(message)
        self.key = key


class MissingDependencyError(ImportError):
    """An env whose package (a Gymnasium extra, a plugin such as ale-py) is not installed; says what to install."""


class CannotRender(ValueError):
    """An env that draws no pictures of its rows (a video of it cannot be made); the message says what would."""
