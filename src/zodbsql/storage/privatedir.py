"""A directory that only the process's user can change: the local blob cache.

Whoever can write to the cache can make zodbsql serve any file as a blob, or make it
create and delete files through planted symbolic links.  So the cache directory is
created 0700, one owned by another user is refused, and below it no symbolic link is
ever followed: a link found where the cache keeps its own directory or file is
removed (removing a link never touches its target).
"""
from __future__ import annotations

import logging
import os
import pwd
import stat

from zodbsql.errors import ConfigurationError

log = logging.getLogger(__name__)

PRIVATE = 0o700
#: Flags that open a file without following a symbolic link in its last component.
NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC


def _user(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def make_private_dir(path: str) -> None:
    """Create ``path`` (and its parents) with mode 0700, or check the existing one: a
    directory owned by this process's user, from which group and others' access is
    removed.  Raises :class:`ConfigurationError` naming the directory and its owner."""
    os.makedirs(path, mode=PRIVATE, exist_ok=True)
    st = os.stat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise ConfigurationError(f"blob cache {path} is not a directory")
    me = os.geteuid()
    if st.st_uid != me:
        raise ConfigurationError(
            f"blob cache {path} is owned by {_user(st.st_uid)}, not by {_user(me)} who runs"
            " this process; a cache another user controls could serve any file as a"
            " blob. Use a directory of this user's own (zodbsql creates it with mode 0700)")
    if stat.S_IMODE(st.st_mode) & 0o077:
        log.warning("blob cache %s had mode %o; set to 0700 so that no other user can"
                    " change it", path, stat.S_IMODE(st.st_mode))
        os.chmod(path, PRIVATE)


def real_dir(path: str) -> None:
    """Make sure ``path`` (inside a private directory) is a directory of its own, not a
    symbolic link or a file: such an entry is removed and the directory made."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        pass
    else:
        if stat.S_ISDIR(st.st_mode):
            return
        log.warning("removing %s from the blob cache: a directory was expected there", path)
        os.unlink(path)
    try:
        os.mkdir(path, PRIVATE)
    except FileExistsError:
        real_dir(path)  # another process made it meanwhile: check what it made


def no_links_below(root: str, path: str, is_file: bool = True) -> bool:
    """Is every entry from ``root`` down to ``path`` a real directory, and ``path``
    itself a regular file (a directory if not ``is_file``), with no symbolic link
    anywhere?  A missing entry raises FileNotFoundError."""
    current = root
    parts = os.path.relpath(path, root).split(os.sep)
    for depth, name in enumerate(parts, 1):
        current = os.path.join(current, name)
        mode = os.lstat(current).st_mode
        last_is_file = is_file and depth == len(parts)
        expected = stat.S_ISREG if last_is_file else stat.S_ISDIR
        if not expected(mode):
            return False
    return True
