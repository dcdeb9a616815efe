"""Exception types of the library: every user-facing failure is one of these, with a one-line message."""

from __future__ import annotations


class QuicksilverError(Exception):
    """Base class: the CLI prints ``str(err)`` on one line and exits non-zero."""


class CheckpointError(QuicksilverError):
    """A checkpoint directory is missing, incomplete or malformed."""


class ConfigError(QuicksilverError, ValueError):
    """A configuration or sampler option is out of range or unknown."""
