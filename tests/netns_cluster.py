"""A Ray cluster whose nodes are as separate as hosts, on one machine: each node runs in
its own network namespace (its own loopback, abstract Unix sockets and ports; veth links
to a switch namespace, addresses 10.77.0.N) and its own mount namespace (a private
/tmp/ray), with `ray start` inside. `ray.cluster_utils.Cluster` shares one namespace and
one /tmp/ray between its nodes, so a socket or a session file of one node answers another
there and a per-node defect would not show.

Processes of a node (trainers) run inside both of its namespaces (`nsenter`). Needs root
and namespaces; `NamespaceCluster.available()` says why not, for a clear skip.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Dict, List, Optional, Sequence

SUBNET = "10.77.0"
PORT = 6390
READY = "braid-node-entered"  # a node's anchor prints it once its namespaces are set up


def _run(*args: str) -> None:
    subprocess.run(list(args), check=True, capture_output=True, text=True, timeout=30)


class NamespaceCluster:
    """`nodes` Ray nodes; node 0 is the head. Use as a context manager."""

    def __init__(self, nodes: int, cpus: int = 2, env: Optional[dict] = None,
                 resources: Optional[Dict[int, Dict[str, float]]] = None,
                 bare: bool = False) -> None:
        """`bare`: the nodes run nothing (no Ray) and have a default route, as fresh
        hosts; the caller starts what it needs in them (`run`, `popen`)."""
        self.nodes = nodes
        self.bare = bare
        self.cpus = cpus
        self.resources = resources or {}  # node -> its custom Ray resources
        self.tag = uuid.uuid4().hex[:6]
        self.switch = f"braid-sw-{self.tag}"
        self.netns = [f"braid-n{i}-{self.tag}" for i in range(nodes)]
        self.anchors: List[Optional[subprocess.Popen]] = [None] * nodes
        self.logs: List[Path] = []
        # Ray 2.60's token authentication off in every process of this test cluster (a
        # token in the shared home would otherwise have to match each node's session).
        self.env = {**(env or os.environ), "RAY_AUTH_MODE": "disabled"}

    @staticmethod
    def available() -> str:
        """'' when namespace clusters can run here, else why not."""
        if os.geteuid() != 0:
            return "needs root (network and mount namespaces)"
        for tool in ("ip", "nsenter", "unshare"):
            if shutil.which(tool) is None:
                return f"needs `{tool}`"
        probe = f"braid-probe-{uuid.uuid4().hex[:6]}"
        try:
            _run("ip", "netns", "add", probe)
            _run("ip", "netns", "del", probe)
        except (subprocess.CalledProcessError, OSError) as e:
            return f"network namespaces are refused here ({e})"
        return ""

    def address(self, node: int) -> str:
        return f"{SUBNET}.{node + 1}"

    def hostname(self, node: int) -> str:
        """Node `node`'s host name (bare clusters; the others share the machine's)."""
        return f"braid-node{node}-{self.tag}"

    def __enter__(self) -> "NamespaceCluster":
        try:
            self._network()
            for node in range(self.nodes):
                self._start_node(node)
            if not self.bare:
                self._wait_for_nodes()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _network(self) -> None:
        _run("ip", "netns", "add", self.switch)
        _run("ip", "-n", self.switch, "link", "add", "br0", "type", "bridge")
        _run("ip", "-n", self.switch, "link", "set", "br0", "up")
        for node, ns in enumerate(self.netns):
            _run("ip", "netns", "add", ns)
            inner, outer = f"eth{node}", f"port{node}"
            _run("ip", "-n", ns, "link", "add", inner, "type", "veth", "peer", "name", outer,
                 "netns", self.switch)
            _run("ip", "-n", self.switch, "link", "set", outer, "master", "br0", "up")
            _run("ip", "-n", ns, "addr", "add", f"{self.address(node)}/24", "dev", inner)
            _run("ip", "-n", ns, "link", "set", inner, "up")
            _run("ip", "-n", ns, "link", "set", "lo", "up")
            if self.bare:  # where Ray finds the node's address, as on a host
                _run("ip", "-n", ns, "route", "add", "default", "dev", inner)

    def _start_node(self, node: int) -> None:
        if self.bare:
            args = ["sleep", "infinity"]  # only holds the node's namespaces
        else:
            args = [str(Path(sys.executable).parent / "ray"), "start", "--block",
                    "--disable-usage-stats", f"--node-ip-address={self.address(node)}",
                    f"--num-cpus={self.cpus}", "--object-store-memory=" + str(128 * 2**20)]
            if node == 0:
                args += ["--head", f"--port={PORT}", "--include-dashboard=false"]
            else:
                args += [f"--address={self.address(0)}:{PORT}"]
            if node in self.resources:
                args += ["--resources=" + json.dumps(self.resources[node])]
        # The node's own /tmp/ray: a tmpfs in a mount namespace of its own.
        script = "mkdir -p /tmp/ray && mount -t tmpfs braid-ray /tmp/ray && "
        unshare = ["unshare", "--mount", "--propagation", "private"]
        log = Path(f"/tmp/braid-netns-{self.tag}-{node}.log")
        self.logs.append(log)
        if self.bare:  # a host name of its own, which its /etc/hosts resolves
            hosts = Path(f"/tmp/braid-netns-{self.tag}-{node}.hosts")
            hosts.write_text(f"127.0.0.1 localhost\n"
                             f"{self.address(node)} {self.hostname(node)}\n")
            self.logs.append(hosts)
            script += f"mount --bind {hosts} /etc/hosts && hostname {self.hostname(node)} && "
            unshare.append("--uts")
        script += f"echo {READY} && exec \"$@\""
        self.anchors[node] = subprocess.Popen(
            ["ip", "netns", "exec", self.netns[node], *unshare, "sh", "-c", script, "sh",
             *args],
            stdout=log.open("w"), stderr=subprocess.STDOUT, env=self.env,
            start_new_session=True)
        self._wait_until_entered(node, log)
        if node == 0 and not self.bare:  # the others join it
            self._wait_for_nodes(1)

    def _wait_until_entered(self, node: int, log: Path) -> None:
        """Waits until the anchor of node `node` is inside its namespaces, with its
        /tmp/ray mounted. Until then `enter` joins whatever namespaces the process is in
        at that moment (the machine's mount namespace, under load): a `ray start` there
        writes its session to the machine's /tmp/ray, and the node's own stays empty."""
        deadline = time.monotonic() + 60
        while READY not in log.read_text():
            if self.anchors[node].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"node {node} did not enter its namespaces: "
                                   f"{log.read_text()[-2000:]}")
            time.sleep(0.05)

    def _wait_for_nodes(self, want: Optional[int] = None) -> None:
        want = self.nodes if want is None else want
        deadline = time.monotonic() + 90
        # The head's address, not 'auto': until `ray start` has written the node's
        # /tmp/ray/ray_current_cluster, 'auto' takes any GCS process it sees, and the
        # process table is the machine's (another Ray instance running outside the
        # cluster would be joined instead).
        probe = (f"import ray; ray.init(address='{self.address(0)}:{PORT}', "
                 "log_to_driver=False); print(sum(n['Alive'] for n in ray.nodes()))")
        while True:
            out = self.run(0, [sys.executable, "-c", probe], timeout=60, check=False)
            if out.returncode == 0 and out.stdout.strip().splitlines()[-1:] == [str(want)]:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the namespace cluster did not reach {want} nodes: "
                                   f"{out.stderr[-2000:]} {self.log_tail()}")
            time.sleep(1)

    def log_tail(self) -> str:
        return " | ".join(log.read_text()[-1000:] for log in self.logs if log.exists())

    def ray_logs(self, node: int, lines: int = 30) -> str:
        """What node `node`'s Ray said: its sockets and the tails of its raylet's, GCS's
        and agents' logs, read inside the node (its /tmp/ray is its own, gone with it).
        For a failure message: a driver that cannot reach its raylet does not say why."""
        logs = "/tmp/ray/session_latest/logs"
        script = (f"ls -l /tmp/ray/session_latest/sockets; cd {logs} && "
                  "for f in raylet.out raylet.err gcs_server.out gcs_server.err "
                  "dashboard_agent.log runtime_env_agent.log; do "
                  f"[ -s $f ] && echo \"== $f\" && tail -n {lines} $f; done")
        try:
            out = self.run(node, ["sh", "-c", script], timeout=30, check=False)
        except subprocess.TimeoutExpired:
            return f"node {node}: its Ray logs could not be read in 30 s"
        return f"node {node}:\n{out.stdout}{out.stderr}"

    def enter(self, node: int) -> List[str]:
        """The command prefix that runs a program inside node `node` (both namespaces)."""
        return ["nsenter", "-t", str(self.anchors[node].pid), "--net", "--mount"] + (
            ["--uts"] if self.bare else [])

    def popen(self, node: int, args: Sequence[str], **kw) -> subprocess.Popen:
        return subprocess.Popen(self.enter(node) + list(args), env=kw.pop("env", self.env),
                                **kw)

    def run(self, node: int, args: Sequence[str], timeout: float = 120,
            check: bool = True) -> subprocess.CompletedProcess:
        out = subprocess.run(self.enter(node) + list(args), capture_output=True, text=True,
                             timeout=timeout, env=self.env)
        if check and out.returncode != 0:
            raise RuntimeError(f"{args} on node {node}: {out.stderr[-2000:]}")
        return out

    def node_of(self, ip: str) -> int:
        """The node whose address is `ip`."""
        return [self.address(n) for n in range(self.nodes)].index(ip)

    def link_bytes(self, node: int) -> Dict[str, int]:
        """Bytes node `node` has received (`rx`) and sent (`tx`) over its link to the
        switch so far: every byte that crossed between it and the other nodes. Read from
        /proc/PID/net/dev of a process inside the node (its network namespace's view)."""
        with open(f"/proc/{self.anchors[node].pid}/net/dev") as f:
            for line in f:
                name, _, fields = line.partition(":")
                if name.strip() == f"eth{node}":
                    values = fields.split()
                    return {"rx": int(values[0]), "tx": int(values[8])}
        raise RuntimeError(f"node {node} has no link eth{node}")

    def pids(self, node: int) -> List[int]:
        """Every process of node `node` (its network namespace's)."""
        out = subprocess.run(["ip", "netns", "pids", self.netns[node]], capture_output=True,
                             text=True, timeout=30)
        return [int(p) for p in out.stdout.split()]

    def kill_node(self, node: int) -> int:
        """SIGKILLs every process of node `node`, as a host that loses power; returns how
        many there were."""
        pids = self.pids(node)
        for pid in pids:
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        return len(pids)

    def restart_node(self, node: int) -> None:
        """Starts node `node` again after kill_node (a fresh /tmp/ray), and waits until
        the cluster has every node."""
        self.kill_node(node)
        self.anchors[node].wait(timeout=30)
        self._start_node(node)
        self._wait_for_nodes()

    def __exit__(self, *exc) -> None:
        for node in reversed(range(self.nodes)):
            if self.anchors[node] is not None:
                self.kill_node(node)
                self.anchors[node].wait(timeout=30)
        for ns in self.netns + [self.switch]:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
        for log in self.logs:
            log.unlink(missing_ok=True)
