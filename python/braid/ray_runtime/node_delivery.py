"""Node-local delivery (``runtime.delivery: node``): a node's constructor serves the
trainer ranks of its node through a Unix socket, each micro-batch view as shared-memory
files.

The trainer process does not join Ray (a Ray driver costs ~40 MB per process); it finds
its node's constructor by an abstract socket name (no file to clean up: the name goes with
the constructor's process) and receives, per request, the descriptors of a view
(transport/view_file.h): an anonymous shared-memory file (``memfd_create``) with the
states around the view and where its tensors lie, then the shared-memory files the
constructor built the tensors in. A view is written once, by its build; the TP peers that
share it receive the same files.

Names are ``names.py``'s. Messages are ``SOCK_SEQPACKET`` datagrams of JSON, one request
or reply each. Requests: ``{"op": "get", "key": [step, bucket, micro_batch, pp, cp,
split_context, whole]}``, answered ``{"size": N, "files": K}`` with the header file (N bytes)
and the K files its tensors lie in, or ``{"error": KIND, "message": TEXT}``; ``{"op":
"attach" | "detach", "client": ID}``, answered ``{"clients": N}`` (the ranks attached
after it). Replies come in request order, so a trainer can keep several requests
outstanding.

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
_MAX_FILES = 64  # a view's header file and the files its tensors lie in


def _address(name: str) -> str:
    return "\0" + name  # Linux abstract namespace


def host_identity() -> str:
    """What the abstract sockets of this process can reach: its boot (the machine) and
    its network namespace. Two processes can talk over node delivery only when equal."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = "?"
    try:
        net = str(os.stat("/proc/self/ns/net").st_ino)
    except OSError:
        net = "?"
    return f"{boot}/net:{net}"


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
    data, fds, _, _ = socket.recv_fds(sock, _MAX_MESSAGE, _MAX_FILES)
    if not data:
        for fd in fds:
            os.close(fd)
        return None, []
    return json.loads(data), fds


def read_view(fds: Sequence[int], size: int) -> Tuple[Dict[str, np.ndarray], str, str]:
    """The arrays and the states of a view (transport/view_file.h): ``fds`` the header
    file, then the files its tensors lie in; closes them all. Each file is mapped private
    (copy-on-write): the arrays are writable, yet no page is copied until it is written,
    and a write stays in this process (the constructor never changes a file it sent). A
    mapping goes with the last array that refers to it."""
    maps = []
    try:
        for k, fd in enumerate(fds):
            length = size if k == 0 else os.fstat(fd).st_size
            maps.append(mmap.mmap(fd, max(length, 1), flags=mmap.MAP_PRIVATE,
                                  prot=mmap.PROT_READ | mmap.PROT_WRITE))
    finally:
        for fd in fds:
            os.close(fd)
    head = maps[0]
    length = int.from_bytes(head[:8], "little")
    header = json.loads(head[8:8 + length])
    base = -(-(8 + length) // _ALIGN) * _ALIGN
    out = {}
    for name, dtype, shape, file, at, nbytes in header["arrays"]:
        if not nbytes:
            out[name] = np.empty(shape, dtype=np.dtype(dtype))
            continue
        raw = np.frombuffer(maps[file], dtype=np.uint8, count=nbytes,
                            offset=at + (base if file == 0 else 0))
        out[name] = raw.view(np.dtype(dtype)).reshape(shape)
    return out, header["before"], header["after"]
