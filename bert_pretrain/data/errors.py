"""The one error type of bad input data (its own module so that every reader can raise it without cycles)."""

from __future__ import annotations


class DataError(ValueError):
    """Bad input data; the message names the file or flag and the fix."""
