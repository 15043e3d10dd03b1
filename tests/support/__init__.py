"""Test-only tasks, importable by Ray workers as ``tests.support.<module>:<Class>``."""
