"""A loopback S3 server for the benchmarks and tests that read remote files: moto's (a
test dependency) in a process of its own, optionally behind a proxy that delays every
request as a remote store's round trip does. Not thread-safe: one server per `with`."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import threading
import time


_CREDENTIALS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION",
                "AWS_EC2_METADATA_DISABLED")


@contextlib.contextmanager
def moto(bucket: str, key: str = "bench", recorder_path=None):
    """moto's S3 server in a process of its own on a free loopback port, with `bucket`,
    and test credentials (`key`) in os.environ meanwhile (restored after): yields (url,
    boto3 client, the server's process). With `recorder_path`, moto records every request
    there (MOTO_RECORDER_FILEPATH). Raises RuntimeError when the server does not start
    within 30 s."""
    import boto3

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = dict(os.environ)
    if recorder_path is not None:
        env["MOTO_RECORDER_FILEPATH"] = str(recorder_path)
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1",
                             "-p", str(port)], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    saved = {k: os.environ.get(k) for k in _CREDENTIALS}
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("moto's S3 server did not start")
                time.sleep(0.1)
        os.environ.update(AWS_ACCESS_KEY_ID=key, AWS_SECRET_ACCESS_KEY=key,
                          AWS_DEFAULT_REGION="us-east-1", AWS_EC2_METADATA_DISABLED="true")
        url = f"http://127.0.0.1:{port}"
        client = boto3.client("s3", endpoint_url=url, region_name="us-east-1")
        client.create_bucket(Bucket=bucket)
        yield url, client, proc
    finally:
        if proc.poll() is None:
            proc.terminate()
        proc.wait(timeout=10)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def server(bucket: str, latency_ms: float = 0):
    """moto(bucket): yields (url, boto3 client). With `latency_ms`, `url` is a proxy that
    holds every chunk a client sends for that long before passing it on (a request's round
    trip on a remote store; the client yielded talks to moto directly)."""
    with moto(bucket) as (url, client, _):
        if latency_ms > 0:
            port = int(url.rsplit(":", 1)[1])
            with _delaying_proxy(port, latency_ms / 1000) as proxy_port:
                yield f"http://127.0.0.1:{proxy_port}", client
        else:
            yield url, client


@contextlib.contextmanager
def _delaying_proxy(target_port: int, delay_s: float):
    """A TCP proxy on a free loopback port, in a thread of its own, to `target_port`:
    what a client sends reaches the target `delay_s` later; replies pass at once."""
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    holder = {}

    async def pipe(reader, writer, delay):
        try:
            while data := await reader.read(1 << 16):
                if delay:
                    await asyncio.sleep(delay)
                writer.write(data)
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def handle(client_reader, client_writer):
        try:
            server_reader, server_writer = await asyncio.open_connection("127.0.0.1",
                                                                         target_port)
        except OSError:
            client_writer.close()
            return
        await asyncio.gather(pipe(client_reader, server_writer, delay_s),
                             pipe(server_reader, client_writer, 0))

    async def start():
        srv = await asyncio.start_server(handle, "127.0.0.1", 0)
        holder["server"] = srv
        holder["port"] = srv.sockets[0].getsockname()[1]
        ready.set()

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(start(), loop)
    ready.wait(10)
    try:
        yield holder["port"]
    finally:
        loop.call_soon_threadsafe(holder["server"].close)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=5)
