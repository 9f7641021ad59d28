"""Node-local delivery (``runtime.delivery: node``): a node's constructor serves the
trainer ranks of its node through a Unix socket, each micro-batch view in a memfd.

The trainer process does not join Ray (a Ray driver costs ~40 MB per process); it finds
its node's constructor by an abstract socket name (no file to clean up: the name goes with
the constructor's process) and receives, per request, a file descriptor of an anonymous
shared-memory file (``memfd_create``) that holds the view and the states around it. The
constructor writes each view once; the TP peers that share it receive the same file.

Names are ``names.py``'s. Messages are ``SOCK_SEQPACKET`` datagrams of JSON (one request or reply each; replies carry
at most one descriptor). Requests: ``{"op": "get", "key": [step, bucket, micro_batch, pp,
cp, split_context, whole]}``, answered ``{"size": N}`` plus the file, or ``{"error": KIND,
"message": TEXT}``; ``{"op": "attach" | "detach", "client": ID}``, answered ``{"clients": N}`` (the ranks
attached after it).
Replies come in request order, so a trainer can keep several requests outstanding.

This module does not import Ray: the trainer side imports it alone.
"""

from __future__ import annotations

import json
import mmap
import os
import socket
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

_ALIGN = 64
_MAX_MESSAGE = 1 << 16


def _address(name: str) -> str:
    return "\0" + name  # Linux abstract namespace


def bind(name: str) -> socket.socket:
    """A socket bound to ``name``; raises OSError (EADDRINUSE) when it is taken. Binding
    is exclusive, so this is also a lock that goes with the process."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        sock.bind(_address(name))
    except OSError:
        sock.close()
        raise
    return sock


def listen(name: str) -> socket.socket:
    """The constructor's listening socket (raises OSError when the name is taken)."""
    sock = bind(name)
    sock.listen(256)
    return sock


def connect(name: str, timeout_s: float) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sock.settimeout(timeout_s)
    try:
        sock.connect(_address(name))
    except OSError:
        sock.close()
        raise
    return sock


def send(sock: socket.socket, message: Dict[str, Any], fds: Sequence[int] = ()) -> None:
    data = json.dumps(message).encode()
    if fds:
        socket.send_fds(sock, [data], list(fds))
    else:
        sock.sendall(data)


def receive(sock: socket.socket) -> Tuple[Optional[Dict[str, Any]], List[int]]:
    """One message and the descriptors it carries; ``(None, [])`` when the peer closed."""
    data, fds, _, _ = socket.recv_fds(sock, _MAX_MESSAGE, 1)
    if not data:
        for fd in fds:
            os.close(fd)
        return None, []
    return json.loads(data), fds


def write_view(arrays: Dict[str, np.ndarray], state_before: str,
               state_after: str) -> Tuple[int, int]:
    """A memfd holding the arrays and the states: ``(fd, size)``."""
    specs = []
    offset = 0
    for name, array in arrays.items():
        specs.append([name, array.dtype.str, list(array.shape), offset, array.nbytes])
        offset += -(-array.nbytes // _ALIGN) * _ALIGN
    header = json.dumps({"before": state_before, "after": state_after,
                         "arrays": specs}).encode()
    base = -(-(8 + len(header)) // _ALIGN) * _ALIGN
    size = max(base + offset, 1)
    fd = os.memfd_create("braid-view", os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, size)
        # pwrite, not a mapping: the kernel fills the file's pages without a fault per
        # page, about twice as fast, and without the GIL (other builds go on meanwhile).
        _write_at(fd, memoryview(len(header).to_bytes(8, "little") + header), 0)
        for (name, _, _, at, nbytes), array in zip(specs, arrays.values()):
            if nbytes:
                data = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
                _write_at(fd, memoryview(data), base + at)
    except BaseException:
        os.close(fd)
        raise
    return fd, size


class ViewFile:
    """A view written to a memfd (``write_view``), closed when the last reference to it
    goes: the constructor service keeps one per view for as long as it keeps the view,
    and hands the same descriptor to every rank that receives it."""

    def __init__(self, arrays: Dict[str, np.ndarray], state_before: str,
                 state_after: str) -> None:
        self.fd, self.size = write_view(arrays, state_before, state_after)

    def __del__(self) -> None:
        try:
            os.close(self.fd)
        except (AttributeError, OSError):
            pass


def _write_at(fd: int, data: memoryview, offset: int) -> None:
    done = 0
    while done < len(data):
        done += os.pwrite(fd, data[done:], offset + done)


def read_view(fd: int, size: int) -> Tuple[Dict[str, np.ndarray], str, str]:
    """The arrays and the states of a view file; closes ``fd``. The arrays lie in a
    private (copy-on-write) mapping of the file: writable, yet no copy is made until a
    page is written, and a write stays in this process (the file is never changed
    after ``write_view``). The mapping goes with the last array that refers to it."""
    try:
        mm = mmap.mmap(fd, size, flags=mmap.MAP_PRIVATE,
                       prot=mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)
    length = int.from_bytes(mm[:8], "little")
    header = json.loads(mm[8:8 + length])
    base = -(-(8 + length) // _ALIGN) * _ALIGN
    out = {}
    for name, dtype, shape, at, nbytes in header["arrays"]:
        if not nbytes:
            out[name] = np.empty(shape, dtype=np.dtype(dtype))
            continue
        raw = np.frombuffer(mm, dtype=np.uint8, count=nbytes, offset=base + at)
        out[name] = raw.view(np.dtype(dtype)).reshape(shape)
    return out, header["before"], header["after"]
