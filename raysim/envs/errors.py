"""The errors of building an env from a config: a wrong id, or an option the env does not take."""

from __future__ import annotations


class UnknownEnvError(ValueError):
    """An env id that names no registered task, importable class or Gymnasium id."""


class EnvOptionError(ValueError):
    """An option the env does not take; ``key`` names it."""

    def __init__(self, message: str, key: str):
        super().__init__(message)
        self.key = key
