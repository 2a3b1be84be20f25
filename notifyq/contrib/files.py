"""``file_digest`` and ``file_gzip``: files under NOTIFYQ_FILES_ROOT, and nowhere else. A path is
confined by its names first (no absolute path, no ``..``, no symlink out of the root), then
opened one folder at a time without following symlinks, so a folder swapped for a link
meanwhile makes the job fail instead of leading out; a file with several hard links is refused
unless allowed."""

from __future__ import annotations

import contextlib
import errno
import gzip
import hashlib
import os
import secrets
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from notifyq.contrib._shared import fails_for_good, validate_payload
from notifyq.contrib.settings import ContribSettings
from notifyq.errors import PermanentFailure

__all__ = ["FileDigestPayload", "FileGzipPayload", "digest_handler", "gzip_handler"]


#: Bytes read (and hashed, and compressed) at a time, so a file of any size costs little memory.
CHUNK = 1024 * 1024


class FileDigestPayload(BaseModel):
    """The payload of ``file_digest``: ``path``, relative to NOTIFYQ_FILES_ROOT."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str = Field(min_length=1)


class FileGzipPayload(BaseModel):
    """The payload of ``file_gzip``: ``path`` and optional ``dest`` (default ``path + ".gz"``),
    both relative to NOTIFYQ_FILES_ROOT; an existing ``dest`` is replaced only with
    ``"overwrite": true``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str = Field(min_length=1)
    dest: str | None = Field(default=None, min_length=1)
    overwrite: bool = False


@dataclass(frozen=True, slots=True)
class _Place:
    """A confined path: the real root, the real path's components under it, and the path as
    the payload gave it (for messages)."""

    root: Path
    parts: tuple[str, ...]
    given: str


def _root(settings: ContribSettings, task: str) -> Path:
    if settings.files_root is None:
        raise PermanentFailure(
            f"{task} is disabled: set NOTIFYQ_FILES_ROOT to the folder the file tasks may use"
        )
    try:
        root = settings.files_root.resolve(strict=True)
    except OSError as exc:
        raise PermanentFailure(
            f"{task}: NOTIFYQ_FILES_ROOT={settings.files_root} cannot be used: {exc}"
        ) from None
    if not root.is_dir():
        raise PermanentFailure(f"{task}: NOTIFYQ_FILES_ROOT={settings.files_root} is no folder")
    return root


def _confine(root: Path, given: str, task: str, *, parent_only: bool = False) -> _Place:
    """Where ``given`` really is under ``root``, refusing any way out of it. Only looks at
    names (lstat and readlink); opens nothing.

    With ``parent_only``, the last component is kept as given (it may not exist yet) and only
    the folder holding it is resolved."""
    if "\x00" in given:
        raise PermanentFailure(f"{task}: path {given!r} contains NUL")
    relative = PurePosixPath(given)
    if relative.is_absolute():
        raise PermanentFailure(
            f"{task}: path {given!r} is absolute; give a path relative to NOTIFYQ_FILES_ROOT"
        )
    if ".." in relative.parts:
        raise PermanentFailure(f"{task}: path {given!r} contains '..', which is not allowed")
    if not relative.parts or relative.parts == (".",):
        raise PermanentFailure(f"{task}: path {given!r} names the root folder itself")
    try:
        if parent_only:
            folder = Path(os.path.realpath(root.joinpath(*relative.parts[:-1])))
            real = folder / relative.name
        else:
            # Not strict: a dangling symlink still resolves to where it points, to be judged.
            real = Path(os.path.realpath(root.joinpath(*relative.parts)))
    except OSError as exc:
        # Even when not strict, realpath fails on a link removed while it reads it.
        raise _path_error(exc, given, task) from None
    if real == root or not real.is_relative_to(root):
        raise PermanentFailure(
            f"{task}: path {given!r} leads outside NOTIFYQ_FILES_ROOT (through '..', a "
            "symlink or a symlinked folder); refusing to touch it"
        )
    return _Place(root, real.relative_to(root).parts, given)


@contextlib.contextmanager
def _folder(place: _Place, task: str) -> Iterator[int]:
    """A descriptor of the folder holding ``place``, opened one component at a time from the
    root without following any symlink: a folder swapped for a symlink after :func:`_confine`
    looked at it makes this fail instead of leading out of the root."""
    fd = os.open(place.root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in place.parts[:-1]:
            try:
                inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except OSError as exc:
                raise _path_error(exc, place.given, task) from None
            os.close(fd)
            fd = inner
        yield fd
    finally:
        os.close(fd)


def _path_error(exc: OSError, given: str, task: str) -> Exception:
    """The failure to raise for ``exc``: a permanent one when the path is the problem."""
    if isinstance(exc, FileNotFoundError):
        return PermanentFailure(f"{task}: {given!r} does not exist")
    if exc.errno == errno.ENOTDIR:
        return PermanentFailure(
            f"{task}: {given!r}: a part of it is not a folder (a file, or a symlink that "
            "appeared while it was being opened); refusing to follow it"
        )
    if exc.errno == errno.ELOOP:
        return PermanentFailure(
            f"{task}: {given!r} changed into a symlink while being opened; refusing to follow it"
        )
    if isinstance(exc, PermissionError):
        return PermanentFailure(f"{task}: {given!r}: permission denied")
    if exc.errno == errno.EINVAL:  # readlink on what stopped being a symlink
        return PermanentFailure(f"{task}: {given!r} changed while being resolved")
    return exc


def _open_regular(
    place: _Place, folder: int, task: str, settings: ContribSettings
) -> tuple[int, os.stat_result]:
    """Opens the regular file ``place`` for reading, or fails without opening anything else.
    A file with more than one hard link is refused unless NOTIFYQ_FILES_ALLOW_HARD_LINKS: a
    link made inside the root to a file outside it is the same file, and no path check can
    tell (the other name may be anywhere on the file system)."""
    name = place.parts[-1]
    try:
        # Looked at first, so a FIFO or a device is never opened (opening one may block or act).
        info = os.stat(name, dir_fd=folder, follow_symlinks=False)
        if stat.S_ISLNK(info.st_mode):  # only a link that realpath could not resolve: a loop
            raise PermanentFailure(f"{task}: {place.given!r} is a symlink that loops")
        _check_regular(info, place, task, settings)
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=folder)
    except OSError as exc:
        raise _path_error(exc, place.given, task) from None
    try:
        # Again on what was opened: the name may have changed hands since it was looked at.
        info = os.fstat(fd)
        _check_regular(info, place, task, settings)
    except BaseException:
        os.close(fd)
        raise
    return fd, info


def _check_regular(
    info: os.stat_result, place: _Place, task: str, settings: ContribSettings
) -> None:
    if not stat.S_ISREG(info.st_mode):
        raise PermanentFailure(f"{task}: {place.given!r} is not a regular file")
    if info.st_nlink > 1 and not settings.files_allow_hard_links:
        raise PermanentFailure(
            f"{task}: {place.given!r} has {info.st_nlink} hard links, and another link may be "
            "outside NOTIFYQ_FILES_ROOT; refusing to read it (set "
            "NOTIFYQ_FILES_ALLOW_HARD_LINKS=true to allow files with several links)"
        )


def digest_handler(settings: ContribSettings) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def file_digest(payload: dict[str, Any]) -> dict[str, Any]:
        """Reads a file under NOTIFYQ_FILES_ROOT in chunks and answers ``{"path", "size",
        "sha256", "lines"}``. ``lines`` counts line breaks, plus one for a last line without
        one (so ``"a\\nb"`` has 2 lines, where ``wc -l`` says 1)."""
        with fails_for_good("file_digest"):
            request = validate_payload(FileDigestPayload, payload, "file_digest")
            place = _confine(_root(settings, "file_digest"), request.path, "file_digest")
            with _folder(place, "file_digest") as folder:
                fd, _ = _open_regular(place, folder, "file_digest", settings)
                with os.fdopen(fd, "rb") as source:
                    size, sha256, lines = _scan(source, None)
        return {"path": request.path, "size": size, "sha256": sha256, "lines": lines}

    return file_digest


def _scan(source: Any, sink: Any) -> tuple[int, str, int]:
    """Reads ``source`` to the end in chunks, copying to ``sink`` if given; answers the size,
    the SHA-256 and the number of lines."""
    digest = hashlib.sha256()
    size = lines = 0
    last = b""
    while chunk := source.read(CHUNK):
        digest.update(chunk)
        size += len(chunk)
        lines += chunk.count(b"\n")
        last = chunk[-1:]
        if sink is not None:
            sink.write(chunk)
    if size and last != b"\n":
        lines += 1
    return size, digest.hexdigest(), lines


def gzip_handler(settings: ContribSettings) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def file_gzip(payload: dict[str, Any]) -> dict[str, Any]:
        """Compresses a file under NOTIFYQ_FILES_ROOT to ``dest`` (default ``path + ".gz"``,
        also under the root), written to a temporary file in the same folder and then renamed
        into place, so ``dest`` is never seen half-written. Answers ``{"path", "dest", "size",
        "gzip_size", "sha256"}``, the size and SHA-256 being the original's."""
        with fails_for_good("file_gzip"):
            request = validate_payload(FileGzipPayload, payload, "file_gzip")
            root = _root(settings, "file_gzip")
            source = _confine(root, request.path, "file_gzip")
            dest_given = request.dest or request.path + ".gz"
            dest = _confine(root, dest_given, "file_gzip", parent_only=True)
            with _folder(source, "file_gzip") as source_folder:
                fd, info = _open_regular(source, source_folder, "file_gzip", settings)
                with os.fdopen(fd, "rb") as reader, _folder(dest, "file_gzip") as dest_folder:
                    _check_dest(dest, dest_folder, info, request.overwrite)
                    size, sha256, gzip_size = _write_gzip(
                        reader, dest, dest_folder, info, request.overwrite
                    )
        return {
            "path": request.path,
            "dest": dest_given,
            "size": size,
            "gzip_size": gzip_size,
            "sha256": sha256,
        }

    return file_gzip


def _check_dest(dest: _Place, folder: int, source: os.stat_result | None, overwrite: bool) -> None:
    try:
        existing = os.stat(dest.parts[-1], dir_fd=folder, follow_symlinks=False)
    except FileNotFoundError:
        return
    if source is not None and (existing.st_dev, existing.st_ino) == (source.st_dev, source.st_ino):
        raise PermanentFailure(f"file_gzip: dest {dest.given!r} is the source file")
    if stat.S_ISDIR(existing.st_mode):
        raise PermanentFailure(f"file_gzip: dest {dest.given!r} is a folder")
    if not overwrite:
        raise PermanentFailure(
            f'file_gzip: dest {dest.given!r} exists; pass "overwrite": true to replace it'
        )


def _write_gzip(
    reader: Any, dest: _Place, folder: int, source: os.stat_result, overwrite: bool
) -> tuple[int, str, int]:
    name = dest.parts[-1]
    temporary = f".{name[:200]}.{secrets.token_hex(6)}.tmp"
    fd = os.open(
        temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=folder
    )
    try:
        # The archive is as private as the original, as with gzip(1).
        os.fchmod(fd, stat.S_IMODE(source.st_mode))
        with os.fdopen(fd, "wb") as raw:
            with gzip.GzipFile(
                filename=name.removesuffix(".gz"),
                mode="wb",
                fileobj=raw,
                compresslevel=6,
                mtime=source.st_mtime,
            ) as compressed:
                size, sha256, _ = _scan(reader, compressed)
            raw.flush()
            os.fsync(raw.fileno())
            gzip_size = os.fstat(raw.fileno()).st_size
        _publish(temporary, name, folder, overwrite, dest)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary, dir_fd=folder)
        raise
    # The rename is durable once the folder is.
    os.fsync(folder)
    return size, sha256, gzip_size


def _publish(temporary: str, name: str, folder: int, overwrite: bool, dest: _Place) -> None:
    """Moves the finished file into place: a rename when replacing is allowed; else a hard
    link, which fails if ``name`` appeared meanwhile, where a rename would replace it."""
    if overwrite:
        os.rename(temporary, name, src_dir_fd=folder, dst_dir_fd=folder)
        return
    try:
        os.link(temporary, name, src_dir_fd=folder, dst_dir_fd=folder, follow_symlinks=False)
    except FileExistsError:
        raise PermanentFailure(
            f'file_gzip: dest {dest.given!r} exists; pass "overwrite": true to replace it'
        ) from None
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOSYS):
            raise
        # A file system without hard links: check, then rename (a narrow race).
        _check_dest(dest, folder, None, overwrite)
        os.rename(temporary, name, src_dir_fd=folder, dst_dir_fd=folder)
        return
    os.unlink(temporary, dir_fd=folder)
