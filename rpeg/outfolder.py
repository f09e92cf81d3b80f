"""Output folders written all at once: a command writes its files into a hidden temporary folder
beside the destination and moves them into place only when every one of them is written, so a
failed command leaves nothing behind and a good one never leaves half its files.

    out = OutputFolder(args.out)        # checks --out at once, before any long work
    ...
    with out:                           # on an exception the temporary folder is removed
        draw_png(g, out.file("grpo.png"))
        paths = out.commit()            # the destination paths, in the order they were named
"""

from __future__ import annotations

import os
import shutil
import tempfile

from rpeg.errors import RpegError


class OutputFolder:
    def __init__(self, path: str):
        if not isinstance(path, str) or not path.strip():
            raise RpegError("--out: an output folder is needed, got an empty name")
        self.final = os.path.normpath(path)
        if os.path.exists(self.final) and not os.path.isdir(self.final):
            raise RpegError(f"--out {path}: exists and is not a folder")
        self.anchor = _existing_ancestor(self.final)
        if not os.access(self.anchor, os.W_OK | os.X_OK):
            raise RpegError(f"--out {path}: cannot write in {self.anchor}")
        self.tmp: str | None = None
        self.names: list[str] = []

    def file(self, name: str) -> str:
        """Where to write `name` now (inside the temporary folder)."""
        if self.tmp is None:
            self.tmp = tempfile.mkdtemp(prefix=".rpeg-out-", dir=self.anchor)
        target = os.path.join(self.final, name)
        if os.path.isdir(target):
            raise RpegError(f"--out {self.final}: {target} is a folder; cannot write the file {name} there")
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
            raise RpegError(f"--out {self.final}: {e.strerror}: {e.filename}") from None
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


def _existing_ancestor(path: str) -> str:
    """The destination's parent if it exists, else the nearest existing folder above it (where the
    temporary folder goes: on the same file system, so the final moves are renames)."""
    here = os.path.dirname(os.path.abspath(path))
    while not os.path.isdir(here):
        if os.path.exists(here):
            raise RpegError(f"--out {path}: {here} is a file, not a folder")
        here = os.path.dirname(here)
    return here
