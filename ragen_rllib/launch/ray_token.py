"""Ray's auth token file: created private (0600) by the project, a warning with the fix otherwise.

Ray 2.60 starts a local cluster with token authentication unless ``RAY_AUTH_MODE=disabled``, and
when no token exists ``ray.init`` writes a new one to ``~/.ray/auth_token`` with the process
umask: mode 0644 on a default system, so any local user can read the token that lets one submit
jobs (run code) on the cluster. So before each local ``ray.init`` the project writes that file
itself, mode 0600, when it is missing (``ensure_private_token(create=True)``); Ray then finds and
uses it. A token file that exists already (made by Ray, by hand, or pointed at with
``$RAY_AUTH_TOKEN_PATH``) is never rewritten: if others can read it, a warning names it and the fix
(``chmod 600 <file>``).

Only the standard library is imported here: the token has the form of Ray's own generator
(``secrets.token_hex(32)``, 256 bits).
"""

from __future__ import annotations

import logging
import os
import secrets
import stat
from pathlib import Path

logger = logging.getLogger(__name__)

#: Environment variables Ray's token loader reads, in its order: the token itself, then a file.
TOKEN_ENV, TOKEN_PATH_ENV, MODE_ENV = "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_MODE"
#: The permission bits a token file may have: read/write for its owner only.
PRIVATE_MODE = 0o600


def token_path() -> Path:
    """The token file Ray reads: ``$RAY_AUTH_TOKEN_PATH``, else ``~/.ray/auth_token``."""
    if os.environ.get(TOKEN_PATH_ENV):
        return Path(os.environ[TOKEN_PATH_ENV]).expanduser()
    return Path.home() / ".ray" / "auth_token"


def mode_problem(path: Path) -> str | None:
    """One line naming ``path`` and the fix when group or others may access it; None when it is
    private or absent."""
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except OSError:
        return None
    if mode & 0o077 == 0:
        return None
    return (f"the Ray auth token file {path} has mode {mode:04o}: other users of this machine can read the token "
            f"that lets anyone submit jobs to your Ray cluster; fix: chmod 600 {path}")


def ensure_private_token(create: bool) -> Path | None:
    """Make sure the token file a Ray start or connection will use is private.

    Args:
        create: write a new token file (mode 0600) when none exists: for a new local cluster, where
            Ray would otherwise write one with the umask's mode. False when connecting to a running
            cluster (its token must come from its head node).

    Returns:
        The token file Ray will read, or None when none is used (``RAY_AUTH_MODE=disabled``, the
        token given in ``$RAY_AUTH_TOKEN``, or no file and ``create`` False).

    A file that exists is never rewritten; if its mode lets others read it, a warning (logged on
    ``ragen_rllib.launch.ray_token``) names it and the ``chmod`` that fixes it.
    """
    if os.environ.get(MODE_ENV, "").strip().lower() == "disabled" or os.environ.get(TOKEN_ENV, "").strip():
        return None
    path = token_path()
    if not path.exists():
        if not create:
            return None
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            # O_EXCL: a token another process wrote meanwhile is kept (and checked below).
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_MODE)
        except FileExistsError:
            pass
        else:
            with os.fdopen(fd, "w") as f:
                os.fchmod(f.fileno(), PRIVATE_MODE)  # the umask can only have removed bits; be explicit
                f.write(secrets.token_hex(32))
            return path
    if problem := mode_problem(path):
        logger.warning(problem)
    return path
