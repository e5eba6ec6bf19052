"""The per-episode workspace: a directory in the CUDA-Agent layout, every path confined to it.

Layout (docs/paper.md §3): `model.py` (the task, read-only), `model_new.py` and `kernels/` (the
agent's solution), `binding.cpp` + `binding_registry.h` (the harness's registry, read-only, for
reference: the builder always compiles the evaluator's own copies) and `SKILL.md` (the rules).
The grader is not here: compile/verify/profile ship `model_new.py` and `kernels/**` to the
evaluator fleet, which pairs them with the task source it was given, never this `model.py`.

The layout comes from `cuda_agent/workspace.py` (standard library only), which the evaluator
builds with too, so the agent process stays torch-free (docs/architecture.md) and both agree on
what a workspace is.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from agent.sandbox import can_switch_uid, jail_has_view
from cuda_agent.jail.uids import UID_CLAIMS_DIR, UID_SPAN, NoFreeUid, claim_uid, kill_processes_of_uid, release_uid
from cuda_agent.contracts import WORKSPACE_ENTRY
from cuda_agent.workspace import KERNELS_DIR, TASK_FILE, TEMPLATE_FILES

PROTECTED_FILES = frozenset({TASK_FILE, *TEMPLATE_FILES})
# Files shipped to the evaluator are capped so a runaway write cannot flood the fleet.
SOLUTION_FILE_MAX_BYTES = 1024 * 1024
SOLUTION_TOTAL_MAX_BYTES = 8 * 1024 * 1024
# Tools that need a whole file (Edit, MultiEdit, NotebookEdit) refuse larger ones; Read streams.
WHOLE_FILE_MAX_BYTES = 8 * 1024 * 1024
_NONBLOCKING = os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0)


def file_kind(mode: int) -> str:
    """What a non-regular file is, in words."""
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISLNK, "a symbolic link"),
    ):
        if test(mode):
            return name
    return "not a regular file"

class WorkspaceError(Exception):
    """A refused path or action; the message goes back to the policy."""


@dataclass
class Workspace:
    """One episode's sandbox directory and the uid its commands run as (None: the agent's own)."""

    root: Path
    task_name: str
    task_source: str
    sandbox_uid: int | None = None

    def resolve(self, path: str, *, for_write: bool = False) -> Path:
        """The real path of `path` (relative to the workspace, or absolute inside it).

        Refuses: empty paths, paths whose real location (symlinks followed) leaves the
        workspace, and, for writing, the harness files and the task.
        """
        if not isinstance(path, str) or not path.strip():
            raise WorkspaceError("path must be a non-empty string")
        if "\x00" in path:
            raise WorkspaceError("path contains a NUL byte")
        root = self.root.resolve()
        candidate = Path(path)
        if not candidate.is_absolute():
            candidate = root / candidate
        real = Path(os.path.realpath(candidate))
        if real != root and root not in real.parents:
            raise WorkspaceError(f"path {path!r} is outside the workspace {root}")
        if for_write:
            relative = real.relative_to(root).as_posix()
            if relative in PROTECTED_FILES:
                raise WorkspaceError(f"{relative} is part of the harness/task and is read-only")
            if real == root:
                raise WorkspaceError("cannot write the workspace directory itself")
        return real

    def relative(self, real: Path) -> str:
        return real.relative_to(self.root.resolve()).as_posix()

    def open_beneath(self, real: Path, flags: int, *, make_parents: bool = False) -> int:
        """Open `real` (a path `resolve` returned) walking from the workspace root one component
        at a time without following any symlink: a directory swapped for a symlink by a
        background command between `resolve` and here makes the open fail, never escape.
        Created directories and files belong to the sandbox uid.
        """
        parts = real.relative_to(self.root.resolve()).parts
        nofollow = getattr(os, "O_NOFOLLOW", 0)
        directory = os.open(self.root.resolve(), os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            for part in parts[:-1]:
                if make_parents:
                    try:
                        os.mkdir(part, 0o755, dir_fd=directory)
                        if self.sandbox_uid is not None:
                            os.chown(part, self.sandbox_uid, self.sandbox_uid, dir_fd=directory, follow_symlinks=False)
                    except FileExistsError:
                        pass
                child = os.open(part, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | nofollow, dir_fd=directory)
                os.close(directory)
                directory = child
            fd = os.open(parts[-1], flags | nofollow, 0o644, dir_fd=directory)
            if flags & os.O_CREAT and self.sandbox_uid is not None:
                os.fchown(fd, self.sandbox_uid, self.sandbox_uid)
            return fd
        finally:
            os.close(directory)

    def open_regular(self, real: Path, path: str, *, write: bool = False) -> int:
        """An fd of the regular file `real` (a path `resolve` returned; `path` as the agent gave
        it, for messages). Never blocks and never follows a link: the open is non-blocking (a FIFO
        without a writer opens at once, one without a reader fails at once) and the file's type is
        checked on the open fd before anything is read or truncated; anything but a regular file
        is refused. For writing the file is created if missing and truncated after the check.
        """
        try:
            kind = os.lstat(real).st_mode
        except FileNotFoundError:
            kind = None
        except OSError as error:
            raise WorkspaceError(f"cannot open {path}: {error.strerror}") from None
        if kind is not None and stat.S_ISDIR(kind):
            raise WorkspaceError(f"{path} is a directory")
        if kind is not None and not stat.S_ISREG(kind):
            raise WorkspaceError(f"{path} is not a regular file ({file_kind(kind)})")
        flags = (os.O_WRONLY | os.O_CREAT if write else os.O_RDONLY) | _NONBLOCKING
        try:
            fd = self.open_beneath(real, flags, make_parents=write)
        except OSError as error:
            if error.errno in (errno.ENXIO, errno.ELOOP, errno.EISDIR):  # raced: a FIFO, socket, link, folder now
                raise WorkspaceError(f"{path} is not a regular file") from None
            verb = "write" if write else "read"
            raise WorkspaceError(f"cannot {verb} {path}: {error.strerror}") from None
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            os.close(fd)
            if stat.S_ISDIR(info.st_mode):
                raise WorkspaceError(f"{path} is a directory")
            raise WorkspaceError(f"{path} is not a regular file ({file_kind(info.st_mode)})")
        os.set_blocking(fd, True)
        if write:
            os.ftruncate(fd, 0)
        return fd

    def write_text(self, path: str, content: str) -> Path:
        """Write a file the agent asked for (never through a symlink, never into a FIFO or other
        special file), owned by the sandbox uid."""
        real = self.resolve(path, for_write=True)
        fd = self.open_regular(real, path, write=True)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(content)
        return real

    def open_for_reading(self, path: str) -> tuple[int, int]:
        """(fd, size) of a regular file of the workspace, for streaming reads."""
        real = self.resolve(path)
        if not os.path.lexists(real):
            raise WorkspaceError(f"{path} does not exist")
        fd = self.open_regular(real, path)
        return fd, os.fstat(fd).st_size

    def read_text(self, path: str, max_bytes: int = WHOLE_FILE_MAX_BYTES) -> str:
        """The whole text of a file, refused when larger than `max_bytes` (never loaded)."""
        fd, size = self.open_for_reading(path)
        with os.fdopen(fd, "rb") as handle:
            data = handle.read(max_bytes + 1) if size <= max_bytes else b""
        if size > max_bytes or len(data) > max_bytes:
            raise WorkspaceError(
                f"{path} is too large ({max(size, len(data))} bytes; this tool reads whole files of up to {max_bytes} bytes): "
                "use Read with offset/limit, or Bash"
            )
        return data.decode("utf-8", errors="replace")

    def solution_files(self) -> dict[str, bytes]:
        """`model_new.py` and every regular file under `kernels/` (symlinks are skipped)."""
        files: dict[str, bytes] = {}
        total = 0
        root = self.root.resolve()
        candidates = [root / WORKSPACE_ENTRY]
        kernels = root / KERNELS_DIR
        if kernels.is_dir() and not kernels.is_symlink():
            for dirpath, dirnames, filenames in os.walk(kernels, followlinks=False):
                candidates += [Path(dirpath) / name for name in sorted(filenames)]
        for path in candidates:
            try:
                info = path.lstat()
            except FileNotFoundError:
                continue
            if not stat.S_ISREG(info.st_mode):
                continue
            if info.st_size > SOLUTION_FILE_MAX_BYTES:
                raise WorkspaceError(f"{self.relative(path)} is larger than {SOLUTION_FILE_MAX_BYTES} bytes")
            total += info.st_size
            if total > SOLUTION_TOTAL_MAX_BYTES:
                raise WorkspaceError(f"solution files exceed {SOLUTION_TOTAL_MAX_BYTES} bytes in total")
            try:
                fd = self.open_regular(path, self.relative(path))
            except WorkspaceError:
                continue  # swapped for a link, a FIFO or removed since the walk
            with os.fdopen(fd, "rb") as handle:
                files[path.relative_to(root).as_posix()] = handle.read(SOLUTION_FILE_MAX_BYTES + 1)
        return files

    def end_commands(self) -> int:
        """Kill every process left by this workspace's commands (only with an own uid)."""
        if self.sandbox_uid is None:
            return 0
        return kill_processes_of_uid(self.sandbox_uid)

    def release(self) -> None:
        """End the commands and give the sandbox uid back (the files stay, owned by that uid)."""
        if self.sandbox_uid is not None:
            kill_processes_of_uid(self.sandbox_uid)
            release_sandbox_uid(self.sandbox_uid)


def claim_sandbox_uid(uid_base: int, claims_dir: Path = UID_CLAIMS_DIR, span: int = UID_SPAN) -> int:
    """A uid in [uid_base, uid_base + span) no other live episode or jail on this host holds."""
    try:
        return claim_uid(uid_base, claims_dir, span)
    except NoFreeUid:
        raise WorkspaceError("no free sandbox uid") from None


def release_sandbox_uid(uid: int, claims_dir: Path = UID_CLAIMS_DIR) -> None:
    release_uid(uid, claims_dir, kill=False)


def create_workspace(
    root: str | Path, task_name: str, task_source: str, *, uid_base: int = 200_000, isolate_uid: bool = True
) -> Workspace:
    """Make the workspace directory for one episode in the shared layout
    (`cuda_agent.workspace.init_workspace`: the task, a starter model_new.py, kernels/, the
    binding registry files and SKILL.md).

    The directory is created fresh (an existing one is refused). Harness files and the task
    are owned by us and read-only; the directory has the sticky bit so a sandbox uid cannot
    delete or rename them; `kernels/` belongs to the sandbox uid.
    """
    from cuda_agent.workspace import WorkspaceError as LayoutError
    from cuda_agent.workspace import init_workspace

    root = Path(root)
    if root.exists():
        raise WorkspaceError(f"workspace {root} already exists")
    try:
        init_workspace(task_source, root)
    except LayoutError as error:
        raise WorkspaceError(str(error)) from None
    # The jail binds the workspace itself; without the jail's view a foreign uid must reach it.
    reachable = jail_has_view() or _traversable_by_others(root)
    uid = claim_sandbox_uid(uid_base) if isolate_uid and can_switch_uid() and reachable else None
    for name in (TASK_FILE, *TEMPLATE_FILES):
        os.chmod(root / name, 0o444)
    workspace = Workspace(root=root, task_name=task_name, task_source=task_source, sandbox_uid=uid)
    if uid is not None:
        os.chown(root, 0, uid)
        os.chmod(root, 0o1770)
        os.chown(root / KERNELS_DIR, uid, uid)
        os.chown(root / WORKSPACE_ENTRY, uid, uid)
    return workspace


def _traversable_by_others(root: Path) -> bool:
    """Whether a foreign uid can reach `root` (every directory above has o+x)."""
    return all(parent.stat().st_mode & stat.S_IXOTH for parent in root.resolve().parents)
