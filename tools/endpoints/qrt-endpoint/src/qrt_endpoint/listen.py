"""The endpoint's listening sockets: unix:///path and tcp://ADDRESS:PORT,
the two address forms of qrtd's [[qpu]] endpoint that a program can serve
(qrt/proto/endpoint.hpp; file:///dev/... is a device, not a listener)."""

from __future__ import annotations

import os
import socket
import stat

BACKLOG = 16


def listen(uri: str, mode: int | None = None, gid: int | None = None) -> tuple[socket.socket, str]:
    """A listening socket for `uri` and the path to unlink at exit ("" for
    TCP).  A UNIX socket gets `mode` as it is bound and group `gid` right
    after; a stale socket at the path is replaced, any other file is not."""
    if uri.startswith("unix://"):
        path = uri[len("unix://"):]
        if not path.startswith("/"):
            raise ValueError(f"{uri}: the path must be absolute")
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            pass
        else:
            if not stat.S_ISSOCK(st.st_mode):
                raise ValueError(f"{uri}: {path} exists and is not a socket")
            os.unlink(path)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(~mode & 0o777) if mode is not None else None
        try:
            s.bind(path)
        except OSError:
            s.close()
            raise
        finally:
            if old is not None:
                os.umask(old)
        if gid is not None:
            os.chown(path, -1, gid, follow_symlinks=False)
        s.listen(BACKLOG)
        return s, path
    if uri.startswith("tcp://"):
        host, _, port = uri[len("tcp://"):].rpartition(":")
        host = host.strip("[]")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"{uri}: give tcp://ADDRESS:PORT")
        fam = socket.AF_INET6 if ":" in host else socket.AF_INET
        s = socket.socket(fam, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, int(port)))
        except OSError:
            s.close()
            raise
        s.listen(BACKLOG)
        return s, ""
    raise ValueError(f"{uri}: the endpoint must be unix:///path or tcp://ADDRESS:PORT")
