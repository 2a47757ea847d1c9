"""Sharing a store: one prepare per network name at a time, and runs that pin a version.

This module owns the store's locks (Linux `flock`, released by the kernel when
the holder dies, so a crash never leaves a store locked):

- `prepare_lock(store, name)`: an exclusive lock on `DIR/.lock~NAME` while a
  network is prepared. A second prepare of the same name fails at once with a
  message naming the holder (or waits, with `wait=True`), instead of deleting
  the first one's work folder. The holder removes the file before it lets go;
  a locker checks that the file it locked is still the one at the path.
- `pin_network(store, name)`: a run's hold on the version of a network it
  started with. It opens the network directory and takes a shared lock on it;
  the run then reads the manifest and every stage file through
  `/proc/self/fd/N`, the directory it opened, so a network re-prepared during
  the run (`_install` swaps the new directory in) is never mixed with the
  pinned one. `version` is the sha256 of the pinned manifest.
- `retire_network(old_dir)`: what prepare does with the version it replaced:
  deleted when no run pins it, otherwise left in a `.retired~NAME~*` folder
  that the next prepare of the name removes once it is free.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import logging
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from masa.common.errors import UserError

log = logging.getLogger(__name__)

_LOCK_PREFIX = ".lock~"
RETIRED_PREFIX = ".retired~"
_MANIFEST_NAME = "manifest.yaml"  # model_prep.manifest.MANIFEST_NAME (imports this module)


def _lock_path(store: Path, name: str) -> Path:
    return store / f"{_LOCK_PREFIX}{name}"


@contextmanager
def prepare_lock(store: str | Path, name: str, wait: bool = False) -> Iterator[None]:
    """Hold the exclusive prepare lock of network `name` in `store`."""
    path = _lock_path(Path(store), name)
    fd = _acquire(path, name, Path(store), wait)
    try:
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        # Unlinked while still held: a waiter that opened the old file sees that
        # the path is gone (or is another file) and opens it again.
        with contextlib.suppress(OSError):
            os.unlink(path)
        os.close(fd)


def _acquire(path: Path, name: str, store: Path, wait: bool) -> int:
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise UserError(f"{path}: cannot create the prepare lock: "
                            f"{exc.strerror or exc}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise UserError(f"{store / name}: another `masa prepare` of {name!r} is "
                            f"running (pid {holder}); wait for it to finish or choose "
                            "another --name") from None
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)  # the holder released (and removed) it meanwhile: again


def _is_pinned(directory: Path) -> bool:
    """A run holds a shared lock on the directory (it pins this version)."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def retire_network(old_dir: Path, store: Path, name: str) -> Path | None:
    """Move a replaced network version out of the way: delete it unless a run pins
    it; then keep it under a `.retired~NAME~` name. The kept folder, if any."""
    if not _is_pinned(old_dir):
        shutil.rmtree(old_dir, ignore_errors=True)
        return None
    kept = store / f"{RETIRED_PREFIX}{name}~{os.getpid()}~{time.time_ns()}"
    os.rename(old_dir, kept)
    log.info("%s: a run still uses the replaced version of %r; kept in %s until it ends",
             store, name, kept)
    return kept


def remove_retired(store: Path, name: str) -> None:
    """Delete the replaced versions of `name` that no run pins any more."""
    for retired in store.glob(f"{RETIRED_PREFIX}{name}~*"):
        if retired.is_dir() and not _is_pinned(retired):
            shutil.rmtree(retired, ignore_errors=True)


class PinnedNetwork:
    """A run's hold on one version of a prepared network (see the module docstring)."""

    def __init__(self, store: str | Path, name: str) -> None:
        self.name = name
        self.store_path = Path(store) / name
        self.fd = self._open_current()
        self.directory = Path(f"/proc/self/fd/{self.fd}")
        try:
            manifest_bytes = (self.directory / _MANIFEST_NAME).read_bytes()
        except OSError:
            manifest_bytes = b""  # the manifest loader names what is missing
        self.version = hashlib.sha256(manifest_bytes).hexdigest()

    def _open_current(self) -> int:
        """Open and share-lock the directory now at `store/name` (retrying if a
        prepare swaps it between the open and the lock)."""
        for _ in range(100):
            try:
                fd = os.open(self.store_path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            except OSError as exc:
                if exc.errno in (errno.ENOENT, errno.ENOTDIR):
                    raise UserError(f"{self.store_path.parent}: no prepared network "
                                    f"{self.name!r}") from None
                raise UserError(f"{self.store_path}: cannot open: "
                                f"{exc.strerror or exc}") from None
            fcntl.flock(fd, fcntl.LOCK_SH)
            try:
                current = os.stat(self.store_path)
            except OSError:
                current = None
            opened = os.fstat(fd)
            if current is not None and (current.st_dev, current.st_ino) == \
                    (opened.st_dev, opened.st_ino):
                return fd
            os.close(fd)  # replaced meanwhile: pin the new version instead
        raise UserError(f"{self.store_path}: the network keeps being replaced; "
                        "cannot pin a version")

    def replaced(self) -> bool:
        """The network at `store/name` is no longer the pinned version."""
        try:
            current = os.stat(self.store_path)
        except OSError:
            return True
        opened = os.fstat(self.fd)
        return (current.st_dev, current.st_ino) != (opened.st_dev, opened.st_ino)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __del__(self) -> None:
        self.close()
