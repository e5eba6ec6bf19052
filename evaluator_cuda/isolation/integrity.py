"""Harness state checked on every load: a sha256 written beside each cache entry by the harness.

Cached builds (libraries, objects, failures) and baselines live outside every jail, so no candidate
can reach them; the digest is the second line: an entry whose bytes no longer match the digest
written when the harness stored it (a disk error, a process outside the jail, an older tree) is
treated as missing, removed, and rebuilt or remeasured, never trusted.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

SUFFIX = ".sha256"


def digest_path(path: Path) -> Path:
    return path.with_name(path.name + SUFFIX)


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def seal(path: Path) -> None:
    """Write the digest of `path` beside it (atomically)."""
    target = digest_path(path)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.write_text(sha256_of(path))
    os.replace(tmp, target)


def intact(path: Path) -> bool:
    """Whether `path` is a regular file whose bytes match the digest beside it; a file that does not
    (or has none) is removed with its digest, so the caller rebuilds it."""
    try:
        if path.is_symlink() or not path.is_file():
            return False
        if digest_path(path).read_text().strip() == sha256_of(path):
            return True
    except OSError:
        pass
    for stale in (path, digest_path(path)):
        try:
            stale.unlink()
        except OSError:
            pass
    return False
