"""Output folders written all at once: a command writes its files into a hidden temporary folder
beside the destination and moves them into place only when every one of them is written, so a
failed command leaves nothing behind and a good one never leaves half its files.

    out = OutputFolder(args.out)        # checks --out at once, before any long work
    ...
    with out:                           # on an exception the temporary folder is removed
        draw_png(g, out.file("grpo.png"))
        paths = out.commit()            # the destination paths, in the order they were named

`writable_folder` and `writable_file` make the same check for commands that write elsewhere
(`rpeg train`'s run folder, `rpeg export --out`, `rpeg calibrate --out`): a folder under /proc or
/sys, a read-only mount or a file in the way is refused in one line before any work, not with a
traceback after it.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile

from rpeg.errors import RpegError


class OutputFolder:
    def __init__(self, path: str, flag: str = "--out"):
        self.flag = flag
        self.final, self.anchor = _checked(path, flag, f"{flag} {path}")
        self.tmp: str | None = None
        self.names: list[str] = []

    def file(self, name: str) -> str:
        """Where to write `name` now (inside the temporary folder)."""
        if self.tmp is None:
            self.tmp = _mkdtemp(self.anchor, f"{self.flag} {self.final}")
        target = os.path.join(self.final, name)
        if os.path.isdir(target):
            raise RpegError(f"{self.flag} {self.final}: {target} is a folder; cannot write the file {name} there")
        self.names.append(name)
        return os.path.join(self.tmp, name)

    def commit(self) -> list[str]:
        """Move every written file into the destination; returns their final paths."""
        paths = []
        try:
            os.makedirs(self.final, exist_ok=True)
            for name in self.names:
                target = os.path.join(self.final, name)
                os.replace(os.path.join(self.tmp, name), target)
                paths.append(target)
        except OSError as e:
            raise RpegError(f"{self.flag} {self.final}: {e.strerror}: {e.filename}") from None
        finally:
            self.discard()
        return paths

    def discard(self) -> None:
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            self.tmp = None

    def __enter__(self) -> OutputFolder:
        return self

    def __exit__(self, *exc) -> None:
        self.discard()


def writable_folder(path: str, flag: str = "--out") -> str:
    """`path` normalised, once it is known that a folder can be made there and written in (it is a
    folder, or its nearest existing parent is one that takes new entries); else a one-line error
    naming `flag`. Nothing is left behind."""
    return _checked(path, flag, f"{flag} {path}")[0]


def writable_file(path: str, flag: str = "--out") -> str:
    """`path` normalised, once it is known that a file can be written there: not a folder, not a device
    or other special file, in a folder that exists or can be made. Nothing is left behind."""
    if not isinstance(path, str) or not path.strip():
        raise RpegError(f"{flag}: a file name is needed, got an empty name")
    label, final = f"{flag} {path}", os.path.normpath(path)
    if os.path.isdir(final):
        raise RpegError(f"{label}: is a folder; name the file to write")
    if os.path.exists(final) and not stat.S_ISREG(os.stat(final).st_mode):
        raise RpegError(f"{label}: exists and is not a regular file")
    parent = os.path.dirname(os.path.abspath(final))
    if os.path.exists(parent) and not os.path.isdir(parent):
        raise RpegError(f"{label}: {parent} is a file, not a folder")
    _checked(parent, flag, label)
    return final


def _checked(path: str, flag: str, label: str) -> tuple[str, str]:
    """(the destination folder, normalised; the existing folder a temporary folder goes in). `label`
    starts each message."""
    if not isinstance(path, str) or not path.strip():
        raise RpegError(f"{flag}: an output folder is needed, got an empty name")
    final = os.path.normpath(path)
    if os.path.exists(final) and not os.path.isdir(final):
        raise RpegError(f"{label}: exists and is not a folder")
    anchor = _existing_ancestor(final, label)
    if not os.access(anchor, os.W_OK | os.X_OK):
        raise RpegError(f"{label}: cannot write in {anchor}")
    # os.access trusts the permission bits, and root passes it on /proc, /sys and read-only mounts,
    # where nothing can be made: making (and removing) an empty folder there is the real test; in the
    # destination too when it exists (a mount point such as /proc takes nothing its parent would)
    for folder in (anchor, final) if os.path.isdir(final) else (anchor,):
        os.rmdir(_mkdtemp(folder, label))
    return final, anchor


def _mkdtemp(anchor: str, label: str) -> str:
    try:
        return tempfile.mkdtemp(prefix=".rpeg-out-", dir=anchor)
    except OSError as e:
        raise RpegError(f"{label}: cannot create anything in {anchor} ({e.strerror})") from None


def _existing_ancestor(path: str, label: str) -> str:
    """The destination's parent if it exists, else the nearest existing folder above it (where the
    temporary folder goes: on the same file system, so the final moves are renames)."""
    here = os.path.dirname(os.path.abspath(path))
    while not os.path.isdir(here):
        if os.path.exists(here):
            raise RpegError(f"{label}: {here} is a file, not a folder")
        here = os.path.dirname(here)
    return here
