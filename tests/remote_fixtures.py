"""Shared pieces of the remote-storage tests (test_s3.py, test_gcs.py): a free loopback
port, the published-dataset files both upload, and the small job that reads them."""

from __future__ import annotations

import io
import itertools
import socket
from typing import Callable, Iterator, Tuple

import pyarrow as pa
import pyarrow.parquet as pq

import braid
from conftest import doc_tokens

DATASET_FILES = 2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parquet_bytes(docs) -> bytes:
    buf = io.BytesIO()
    pq.write_table(pa.table({"input_ids": pa.array(docs, type=pa.list_(pa.int32()))}), buf,
                   row_group_size=8)
    return buf.getvalue()


def dataset_files() -> Iterator[Tuple[str, bytes]]:
    """(name, Parquet bytes) of a two-file dataset in the published layout."""
    for f in range(DATASET_FILES):
        docs = [doc_tokens(0, 100 * f + i, 5 + (7 * i) % 40) for i in range(30)]
        yield f"data/train-{f:05d}-of-{DATASET_FILES:05d}.parquet", parquet_bytes(docs)


def write_dataset(local, upload: Callable[[str, bytes], None]):
    """Writes the dataset under `local` and passes every file to `upload(name, body)`."""
    (local / "data").mkdir()
    for name, body in dataset_files():
        upload(name, body)
        (local / name).write_bytes(body)
    return local


def config_for(path: str, **source_extra) -> dict:
    return {
        "seed": 3,
        "topology": {"dp": 2},
        "batch": {"global_tokens": 2 * 2 * 32, "seq_len": 32},
        "sources": [{"name": "web", "path": path, "tokens_column": "input_ids",
                     "shuffle_window": 16, **source_extra}],
    }


def batches(config, n=6):
    return list(itertools.islice(iter(braid.Loader(config, rank=1, world_size=2)), n))
