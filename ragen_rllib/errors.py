"""The project's error for bad user input. Stdlib only: every layer may raise it.

``ConfigError`` covers a bad experiment or sweep file, key, value, profile, env name or path.
Its message is one line that names the offending file, key or value and says what to do. The
CLI prints it as ``error: <message>`` and exits with code 1, without a traceback. A missing file
stays a ``FileNotFoundError`` (also one line, and also printed that way).

It subclasses ``ValueError`` so that callers which catch ``ValueError`` keep working.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """Bad user input (config file, key, value, path, model, env); the message is one line.

    Example::

        raise ConfigError(f"{path}: starpo.env_groups must be an int >= 1, got {value!r}")
    """
