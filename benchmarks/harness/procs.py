"""The harness's processes: the memory of process trees from /proc, what
`benchmarks/bench.py` and `benchmarks/loader_memory.py` count (PSS, so shared pages count
once); the environment of the Python processes the harness starts; a free port for their
process group. Linux only. Stateless; thread-safe."""

from __future__ import annotations

import os
import socket
from typing import Any, Dict, Iterable, List, Optional

# benchmarks/, the folder that holds this package.
HARNESS_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def proc_fields(pid: int, name: str) -> Optional[Dict[str, str]]:
    """The "Key: value" lines of /proc/PID/NAME (status, smaps_rollup...) as
    {key: value}, or None if the process is gone."""
    try:
        with open(f"/proc/{pid}/{name}") as f:
            text = f.read()
    except OSError:
        return None
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            out[key] = value.strip()
    return out


def smaps_rollup(pid: int) -> Optional[Dict[str, int]]:
    """The process's rollup fields in bytes (Pss, Pss_Anon, Pss_File, Pss_Shmem, Rss...),
    or None if it is gone."""
    fields = proc_fields(pid, "smaps_rollup")
    if fields is None:
        return None
    out = {}
    for key, value in fields.items():
        parts = value.split()
        if len(parts) == 2 and parts[1] == "kB":
            out[key] = int(parts[0]) * 1024
    return out


def threads(pid: int) -> int:
    """The process's thread count (0 if it is gone)."""
    return int((proc_fields(pid, "status") or {}).get("Threads", "0"))


def children_map() -> Dict[int, List[int]]:
    """ppid -> pids, from one scan of /proc."""
    out: Dict[int, List[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        # The command may hold spaces and parentheses: fields follow the last ')'.
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        out.setdefault(ppid, []).append(int(name))
    return out


def descendants(roots: Iterable[int], children: Dict[int, List[int]]) -> List[int]:
    out, todo = [], list(roots)
    while todo:
        pid = todo.pop()
        for child in children.get(pid, []):
            out.append(child)
            todo.append(child)
    return out


def memfd_bytes(pids: Iterable[int], seen: Dict[int, int]) -> None:
    """Adds to `seen` (inode -> bytes) the anonymous shared-memory files (memfd) the
    processes hold open: memory no process's PSS shows while none maps it (node
    delivery's views wait in them for the trainer ranks)."""
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if not os.readlink(f"/proc/{pid}/fd/{fd}").startswith("/memfd:"):
                    continue
                st = os.stat(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            seen[st.st_ino] = st.st_blocks * 512


def process_label(pid: int) -> str:
    """A short name for a process: its title if it set one (Ray's workers: "ray::..."),
    the script a Python process runs, else its program's base name ("" if gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return ""
    if not argv:
        return ""
    if len(argv) == 1 and " " in argv[0]:  # a title set over the whole command line
        argv = argv[0].split()
    program = os.path.basename(argv[0])
    if program.startswith("python"):
        script = next((a for a in argv[1:] if a.endswith(".py")), "")
        return os.path.basename(script) or program
    return program


def sample(trainers: List[int], extra: List[int]) -> Dict[str, Any]:
    """Summed PSS of the trainers, their descendants (forked workers) and `extra`, plus
    the shared-memory files they hold open (counted once each, in `extra`'s column: it
    is the loader's, whichever process holds it). `extra_parts`: `extra`'s PSS by
    process_label (the memfd files apart, under "memfd")."""
    children = children_map()
    workers = descendants(trainers, children)
    sums: Dict[str, Any] = {"trainers": 0, "workers": 0, "extra": 0}
    parts: Dict[str, int] = {}
    anon = 0
    for kind, pids in (("trainers", trainers), ("workers", workers), ("extra", extra)):
        for pid in pids:
            roll = smaps_rollup(pid)
            if roll:
                sums[kind] += roll.get("Pss", 0)
                anon += roll.get("Pss_Anon", 0) + roll.get("Pss_Shmem", 0)
                if kind == "extra":
                    label = process_label(pid)
                    parts[label] = parts.get(label, 0) + roll.get("Pss", 0)
    held: Dict[int, int] = {}
    memfd_bytes(list(trainers) + workers + list(extra), held)
    sums["memfd"] = sum(held.values())
    sums["extra"] += sums["memfd"]
    if extra:
        parts["memfd"] = sums["memfd"]
        sums["extra_parts"] = parts
    anon += sums["memfd"]
    sums["total"] = sums["trainers"] + sums["workers"] + sums["extra"]
    sums["anon_shmem"] = anon
    sums["processes"] = len(trainers) + len(workers) + len(extra)
    return sums


def python_env(extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """The environment of a Python process the harness starts: this one's plus `extra`,
    with HARNESS_ROOT first on PYTHONPATH, so that `python -m harness.NAME` finds this
    package from any working directory and under any interpreter."""
    env = dict(os.environ, **(extra or {}))
    env["PYTHONPATH"] = os.pathsep.join(
        [HARNESS_ROOT] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for a process group)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
