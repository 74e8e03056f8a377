"""A case-insensitive filesystem for tests: a FUSE passthrough over a backing directory that
finds names as a case-insensitive filesystem does (vfat, exFAT, SMB shares, WSL's /mnt/c,
macOS's default APFS, ext4 directories with `chattr +F`): "orders" opens the entry spelled
"Orders", and creating "orders" beside "Orders" finds the existing one. Names keep the
spelling they were created with. Like vfat and NTFS it refuses the characters Windows
reserves in names (`"*:<>?\\|`) with EINVAL.

Run as `python casefold_fs.py BACKING MOUNTPOINT` (foreground; unmount with
`fusermount3 -u MOUNTPOINT`). Needs /dev/fuse, root and the `mfusepy` package with libfuse.
"""

from __future__ import annotations

import errno
import os
import sys
import threading
from typing import Any

import mfusepy

_RESERVED = set('"*:<>?\\|')


class CaseFoldingPassthrough(mfusepy.Operations):  # type: ignore[misc]
    use_ns = True

    def __init__(self, backing: str) -> None:
        self.backing = os.path.realpath(backing)
        self._lock = threading.Lock()  # a create and the lookup before it are one step

    # names ------------------------------------------------------------------------------
    def _find(self, path: str) -> str:
        """The backing path `path` names, each part matched without regard to case; a last
        part that matches nothing keeps its own spelling (a name about to be created)."""
        real = self.backing
        for part in (p for p in path.split("/") if p):
            exact = os.path.join(real, part)
            if os.path.lexists(exact):
                real = exact
                continue
            folded = part.casefold()
            match = None
            try:
                for name in os.listdir(real):
                    if name.casefold() == folded:
                        match = name
                        break
            except (FileNotFoundError, NotADirectoryError):
                pass
            real = os.path.join(real, match if match is not None else part)
        return real

    def _new_name(self, path: str) -> str:
        name = os.path.basename(path)
        if _RESERVED & set(name):
            raise mfusepy.FuseOSError(errno.EINVAL)
        return self._find(path)

    # attributes and directories -----------------------------------------------------------
    def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
        st = os.lstat(self._find(path)) if fh is None else os.fstat(fh)
        keys = ("st_mode", "st_nlink", "st_uid", "st_gid", "st_size", "st_atime", "st_mtime", "st_ctime")
        attrs = {key: getattr(st, key) for key in keys}
        attrs.update(st_atime=st.st_atime_ns, st_mtime=st.st_mtime_ns, st_ctime=st.st_ctime_ns)
        attrs["st_blocks"] = st.st_blocks
        return attrs

    def readdir(self, path: str, fh: int) -> list[str]:
        return [".", "..", *os.listdir(self._find(path))]

    def mkdir(self, path: str, mode: int) -> int:
        with self._lock:
            os.mkdir(self._new_name(path), mode)
        return 0

    def rmdir(self, path: str) -> int:
        os.rmdir(self._find(path))
        return 0

    def unlink(self, path: str) -> int:
        os.unlink(self._find(path))
        return 0

    def rename(self, old: str, new: str) -> int:
        with self._lock:
            os.rename(self._find(old), self._new_name(new))
        return 0

    def chmod(self, path: str, mode: int) -> int:
        os.chmod(self._find(path), mode)
        return 0

    def chown(self, path: str, uid: int, gid: int) -> int:
        os.chown(self._find(path), uid, gid)
        return 0

    def utimens(self, path: str, times: tuple[int, int] | None = None) -> int:
        os.utime(self._find(path), ns=times)
        return 0

    def statfs(self, path: str) -> dict[str, int]:
        st = os.statvfs(self._find(path))
        keys = ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree", "f_files", "f_flag", "f_frsize",
                "f_namemax")  # fmt: skip
        return {key: getattr(st, key) for key in keys}

    # files --------------------------------------------------------------------------------
    def create(self, path: str, mode: int, fi: Any = None) -> int:
        with self._lock:
            return os.open(self._new_name(path), os.O_RDWR | os.O_CREAT, mode)

    def open(self, path: str, flags: int) -> int:
        return os.open(self._find(path), flags & ~(os.O_CREAT | os.O_EXCL))

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        return os.pread(fh, size, offset)

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        return os.pwrite(fh, data, offset)

    def truncate(self, path: str, length: int, fh: int | None = None) -> int:
        if fh is None:
            os.truncate(self._find(path), length)
        else:
            os.ftruncate(fh, length)
        return 0

    def fallocate(self, path: str, mode: int, offset: int, size: int, fh: int) -> int:
        if mode != 0:
            raise mfusepy.FuseOSError(errno.EOPNOTSUPP)
        os.posix_fallocate(fh, offset, size)
        return 0

    def flush(self, path: str, fh: int) -> int:
        return 0

    def fsync(self, path: str, datasync: int, fh: int) -> int:
        os.fsync(fh)
        return 0

    def fsyncdir(self, path: str, datasync: int, fh: int) -> int:
        return 0

    def release(self, path: str, fh: int) -> int:
        os.close(fh)
        return 0


def main() -> None:
    backing, mountpoint = sys.argv[1], sys.argv[2]
    # hard_remove: an unlinked file still open is gone at once, as on a real filesystem (not
    # renamed to .fuse_hidden*, which kept a cleaned queue's directory from being empty).
    mfusepy.FUSE(CaseFoldingPassthrough(backing), mountpoint, foreground=True, allow_other=True, hard_remove=True)


if __name__ == "__main__":
    main()
