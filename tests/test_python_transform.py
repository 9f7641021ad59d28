"""User-defined Python transforms (`sources[].transform`) end to end, through the loader.

The transforms live in a real module written to a temporary folder on sys.path, as a
user's would. Document d's text is the decimal token ids "d*1000+0 d*1000+1 ...", so every
token of a batch says which document and offset it came from.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Dict, List

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import braid
from braid import _core

MODULE = textwrap.dedent('''
    import numpy as np

    def encode(text):
        return [int(word) for word in text.split()]

    def encode_numpy(text):
        return np.array(encode(text), dtype=np.int64)

    def with_mask(text, prompt_len):
        ids = encode(text)
        return {"tokens": ids, "loss_mask": [0] * prompt_len + [1] * (len(ids) - prompt_len)}

    def strict(text):
        if text.startswith("bad"):
            raise ValueError("cannot use " + text[:6])
        if text.startswith("drop"):
            return None
        return encode(text)

    def bad_mask(text):
        return {"tokens": [1, 2, 3], "loss_mask": [1]}

    def slow(text):
        total = 0
        for i in range(20000):  # pure Python: holds the GIL
            total += i
        return encode(text)

    not_callable = 42

    # A thread's threading.local lives in its Python thread state: `fresh` records, per
    # call, whether the calling thread's state was new (no earlier call had seen it).
    import threading
    _local = threading.local()
    fresh = []

    def count_states(text):
        fresh.append(not hasattr(_local, "calls"))
        _local.calls = getattr(_local, "calls", 0) + 1
        return encode(text)

    # Batched forms: one list per column, one result per row.
    batch_sizes = []

    def encode_batch(texts):
        assert isinstance(texts, list), type(texts)
        batch_sizes.append(len(texts))
        return [encode(t) for t in texts]

    def with_mask_batch(texts, prompt_lens):
        assert len(texts) == len(prompt_lens)
        return (with_mask(t, p) for t, p in zip(texts, prompt_lens))  # any iterable

    def strict_batch(texts):
        return [strict(t) for t in texts]  # one bad row fails the whole call

    def numpy_batch(texts):
        return [encode_numpy(t) for t in texts]

    def short_batch(texts):
        return [encode(t) for t in texts][1:]

    def text_batch(texts):
        return "not a list"
    ''')

DOCS = 48


def doc_ids(d: int, length: int) -> List[int]:
    return [d * 1000 + k for k in range(length)]


@pytest.fixture
def data(tmp_path: Path, monkeypatch) -> Dict:
    """The module on sys.path and a Parquet file of DOCS texts (row groups of 8)."""
    pkg = tmp_path / "usermods"
    pkg.mkdir()
    (pkg / "braid_user_tx.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(pkg))
    rng = np.random.default_rng(5)
    lengths = [int(n) for n in rng.integers(2, 40, size=DOCS)]
    texts = [" ".join(str(t) for t in doc_ids(d, n)) for d, n in enumerate(lengths)]
    texts[9] = "bad row " + texts[9]
    texts[30] = "bad too " + texts[30]
    texts[17] = "drop " + texts[17]
    pq.write_table(pa.table({"text": texts, "prompt_len": [n // 2 for n in lengths]}),
                   tmp_path / "t.parquet", row_group_size=8)
    return {"path": str(tmp_path / "t.parquet"), "lengths": lengths}


def config(data: Dict, transform: Dict, **source) -> Dict:
    return {
        "seed": 3,
        "topology": {"dp": 2, "tp": 1, "pp": 1, "cp": 1},
        "batch": {"global_tokens": 2 * 64, "seq_len": 64, "micro_batch_size": 1},
        "sources": [dict({"name": "user", "path": data["path"], "shuffle_window": 12,
                          "transform": transform}, **source)],
    }


def batches(cfg: Dict, n: int, rank: int = 0) -> List[Dict[str, np.ndarray]]:
    loader = braid.Loader(cfg, rank=rank, world_size=2)
    return [{k: v.numpy().copy() for k, v in b.items()}
            for b in itertools.islice(iter(loader), n)]


def pieces(batch: Dict[str, np.ndarray]):
    """(ids, loss_mask) of each packed piece of a micro-batch."""
    cu = batch["cu_seqlens"].tolist()
    ids, mask = batch["input_ids"][0].tolist(), batch["loss_mask"][0].tolist()
    for a, b in zip(cu, cu[1:]):
        yield ids[a:b], mask[a:b]


def test_text_column_is_mapped_to_ids_by_a_module_function(data):
    cfg = config(data, {"python": "braid_user_tx:encode", "columns": ["text"]},
                 on_error="skip")
    seen = set()
    for batch in batches(cfg, 12):
        for ids, _ in pieces(batch):
            # Each piece is a run of consecutive ids of one document.
            d, k = divmod(ids[0], 1000)
            assert ids == doc_ids(d, k + len(ids))[k:], ids
            assert k + len(ids) <= data["lengths"][d]
            seen.add(d)
    assert len(seen) > 20
    assert not seen & {9, 17, 30}  # failed and dropped rows never arrive


def test_numpy_result_and_registered_function(data):
    from braid_user_tx import encode_numpy  # noqa: E402 (on sys.path via the fixture)

    braid.register_transform("user_numpy", encode_numpy)
    try:
        by_name = batches(config(data, {"python": "user_numpy", "columns": ["text"]},
                                 on_error="skip"), 6)
    finally:
        braid.unregister_transform("user_numpy")
    by_module = batches(config(data, {"python": "braid_user_tx:encode",
                                      "columns": ["text"]}, on_error="skip"), 6)
    assert len(by_name) == len(by_module) == 6
    for a, b in zip(by_name, by_module):
        assert a.keys() == b.keys()
        for k in a:
            np.testing.assert_array_equal(a[k], b[k])


def test_loss_mask_from_a_dict_result(data):
    cfg = config(data, {"python": "braid_user_tx:with_mask",
                        "columns": ["text", "prompt_len"]}, on_error="skip")
    trained = untrained = 0
    for batch in batches(cfg, 10):
        for ids, mask in pieces(batch):
            for j in range(len(ids) - 1):
                # mask[j] belongs to the label of position j: token ids[j + 1].
                d, k = divmod(ids[j + 1], 1000)
                expected = 1.0 if k >= data["lengths"][d] // 2 else 0.0
                assert mask[j] == expected, (d, k)
                trained += int(expected)
                untrained += 1 - int(expected)
            # The last position's label is the document's next token if the piece was cut.
            d, k = divmod(ids[-1], 1000)
            nxt = k + 1
            expected = 1.0 if data["lengths"][d] > nxt >= data["lengths"][d] // 2 else 0.0
            assert mask[-1] == expected, (d, k)
    assert trained > 50 and untrained > 50


def test_exception_fails_naming_source_file_row_group_and_row(data):
    cfg = config(data, {"python": "braid_user_tx:strict", "columns": ["text"]})
    with pytest.raises(braid.DataError) as info:
        batches(cfg, 40)
    msg = str(info.value)
    assert "source 'user'" in msg
    assert data["path"] in msg
    assert "(row group 1, row 9)" in msg or "(row group 3, row 30)" in msg, msg
    assert "sources[0].transform.python ('braid_user_tx:strict')" in msg
    assert "ValueError: cannot use bad ro" in msg or "ValueError: cannot use bad to" in msg


def test_exception_is_skipped_counted_and_logged(data, capfd):
    cfg = _core.parse_config(json.dumps(config(
        data, {"python": "braid_user_tx:strict", "columns": ["text"]}, on_error="skip")),
        "/")
    # Two epochs: two failing rows and one None per epoch.
    result = _core.read_source(cfg, 0, 2 * DOCS)
    assert result["skipped"] == 6
    expected = sum(n for d, n in enumerate(data["lengths"]) if d not in (9, 17, 30))
    assert result["tokens"] == 2 * expected
    err = capfd.readouterr().err
    assert "braid: source 'user' skipped " + data["path"] + " (row group 1, row 9)" in err
    assert "ValueError: cannot use bad ro" in err
    assert "(row group 2, row 17): the transform returned None" in err


def test_bad_result_is_a_row_error(data):
    cfg = config(data, {"python": "braid_user_tx:bad_mask", "columns": ["text"]})
    with pytest.raises(braid.DataError, match="loss_mask has 1 values for 3 tokens"):
        batches(cfg, 2)


def test_dropping_a_loader_while_its_workers_call_python_does_not_hang(data, tmp_path):
    # The engine is destroyed by the thread that holds the GIL while worker threads wait
    # for it inside the transform; stopping must let them finish. Run in a subprocess so
    # that a hang fails the test instead of hanging the suite.
    cfg = config(data, {"python": "braid_user_tx:slow", "columns": ["text"]},
                 on_error="skip", workers=4, loaders=2)
    script = textwrap.dedent(f"""
        import itertools, json, sys
        sys.path.insert(0, {str(tmp_path / "usermods")!r})
        import braid
        cfg = json.loads({json.dumps(json.dumps(cfg))})
        for round in range(5):
            loader = braid.Loader(cfg, rank=0, world_size=2)
            it = iter(loader)
            next(it)
            del it
            loader._engine = None  # the engine goes while its workers are busy
        print("done")
        """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, env=dict(os.environ))
    assert proc.returncode == 0, proc.stderr
    assert "done" in proc.stdout


def test_worker_and_loader_counts_do_not_change_the_stream(data):
    tx = {"python": "braid_user_tx:with_mask", "columns": ["text", "prompt_len"]}
    base = batches(config(data, tx, on_error="skip", workers=1), 10, rank=1)
    for extra in ({"workers": 4}, {"workers": 3, "loaders": 3}):
        other = batches(config(data, tx, on_error="skip", **extra), 10, rank=1)
        assert len(other) == len(base) == 10
        for a, b in zip(base, other):
            for k in a:
                np.testing.assert_array_equal(a[k], b[k], err_msg=f"{extra} {k}")


@pytest.mark.parametrize("spec, what", [
    ("braid_no_such_module:encode", "ModuleNotFoundError"),
    ("braid_user_tx:nothing_here", "AttributeError"),
    ("braid_user_tx:not_callable", "is not callable"),
    ("never_registered", "braid.register_transform"),
])
def test_bad_spec_is_a_config_error_naming_the_key(data, spec, what):
    loader = braid.Loader(config(data, {"python": spec, "columns": ["text"]}),
                          rank=0, world_size=2)
    with pytest.raises(braid.ConfigError) as info:
        iter(loader)
    assert "sources[0].transform.python" in str(info.value)
    assert what in str(info.value)


def test_transform_config_is_checked(data):
    with pytest.raises(braid.ConfigError, match=r"sources\[0\].transform.columns"):
        braid.load_config(config(data, {"python": "braid_user_tx:encode"}))
    with pytest.raises(braid.ConfigError, match="exactly one of"):
        braid.load_config(config(data, {"python": "m:f", "columns": ["text"]},
                                 tokens_column="x"))
    # A missing column is a data error naming the file, the column and its key.
    with pytest.raises(braid.DataError,
                       match=r"no column 'nope' \(sources\[0\].transform.columns\[0\]\)"):
        loader = braid.Loader(config(data, {"python": "braid_user_tx:encode",
                                            "columns": ["nope"]}), rank=0, world_size=2)
        iter(loader)
    with pytest.raises(braid.ConfigError, match=r"sources\[0\].loaders"):
        braid.load_config(config(data, {"python": "m:f", "columns": ["text"]}, loaders=0))


def source_stream(data: Dict, transform: Dict, samples: int, **source) -> List[Dict]:
    cfg = _core.parse_config(json.dumps(config(data, transform, **source)), "/")
    return _core.source_samples(cfg, 0, samples)


def test_pool_threads_keep_one_python_thread_state(data):
    import braid_user_tx  # noqa: E402 (on sys.path via the fixture)

    before = _core._kept_thread_states()
    braid_user_tx.fresh.clear()
    cfg = _core.parse_config(json.dumps(config(
        data, {"python": "braid_user_tx:count_states", "columns": ["text"]},
        on_error="skip", workers=2)), "/")
    result = _core.read_source(cfg, 0, 3 * DOCS)
    assert result["samples"] == 3 * DOCS
    calls = len(braid_user_tx.fresh)
    assert calls >= 3 * DOCS
    # The loader's pool has workers + 1 = 3 threads: at most 3 new states for all calls
    # (a state per call would make every call's state new).
    assert 1 <= sum(braid_user_tx.fresh) <= 3, (sum(braid_user_tx.fresh), calls)
    # The loader is gone: its threads ended and freed their states.
    assert _core._kept_thread_states() == before


@pytest.mark.parametrize("per_row, batched", [
    ("braid_user_tx:strict", "braid_user_tx:strict_batch"),
    ("braid_user_tx:encode_numpy", "braid_user_tx:numpy_batch"),
])
def test_batched_stream_is_the_per_row_stream_for_any_worker_count(data, per_row, batched):
    import braid_user_tx  # noqa: E402

    n = 3 * DOCS
    base = source_stream(data, {"python": per_row, "columns": ["text"]}, n,
                         on_error="skip", workers=1)
    assert len(base) == n
    assert sum(s["skip"] != 0 for s in base) == 9  # rows 9, 17, 30 (they fail or drop)
    for workers in (1, 2, 3):
        del braid_user_tx.batch_sizes[:]
        got = source_stream(data, {"python": batched, "columns": ["text"],
                                   "batched": True}, n, on_error="skip", workers=workers)
        assert got == base, workers


def test_batched_function_gets_one_list_per_column(data):
    import braid_user_tx  # noqa: E402

    del braid_user_tx.batch_sizes[:]
    got = source_stream(data, {"python": "braid_user_tx:encode_batch", "columns": ["text"],
                               "batched": True}, DOCS, on_error="skip")
    assert len(got) == DOCS
    sizes = list(braid_user_tx.batch_sizes)
    assert max(sizes) > 1 and sum(sizes) >= DOCS, sizes
    # Two columns, a generator for a result, end to end through the Loader.
    tx = {"python": "braid_user_tx:with_mask", "columns": ["text", "prompt_len"]}
    txb = {"python": "braid_user_tx:with_mask_batch", "columns": ["text", "prompt_len"],
           "batched": True}
    base = batches(config(data, tx, on_error="skip"), 8, rank=1)
    for workers in (1, 3):
        other = batches(config(data, txb, on_error="skip", workers=workers), 8, rank=1)
        assert len(other) == len(base) == 8
        for a, b in zip(base, other):
            for k in a:
                np.testing.assert_array_equal(a[k], b[k], err_msg=f"{workers} {k}")


def test_batched_exception_names_source_file_row_group_and_row(data, capfd):
    tx = {"python": "braid_user_tx:strict_batch", "columns": ["text"], "batched": True}
    with pytest.raises(braid.DataError) as info:
        batches(config(data, tx), 40)
    msg = str(info.value)
    assert "source 'user'" in msg
    assert data["path"] in msg
    assert "(row group 1, row 9)" in msg or "(row group 3, row 30)" in msg, msg
    assert "sources[0].transform.python ('braid_user_tx:strict_batch', batched)" in msg
    assert "ValueError: cannot use bad ro" in msg or "ValueError: cannot use bad to" in msg
    # With skip, only the failing rows go (the rest of their batches arrive).
    cfg = _core.parse_config(json.dumps(config(data, tx, on_error="skip")), "/")
    result = _core.read_source(cfg, 0, DOCS)
    assert result["skipped"] == 3
    assert result["tokens"] == sum(n for d, n in enumerate(data["lengths"])
                                   if d not in (9, 17, 30))
    assert "(row group 1, row 9)" in capfd.readouterr().err


@pytest.mark.parametrize("fn, what", [
    ("short_batch", "the batched transform returned 0 results for 1 rows"),
    ("text_batch", "returns a list of one result per row, not str"),
])
def test_batched_result_of_the_wrong_shape_is_a_row_error(data, fn, what):
    tx = {"python": "braid_user_tx:" + fn, "columns": ["text"], "batched": True}
    with pytest.raises(braid.DataError, match="row group") as info:
        batches(config(data, tx), 2)
    assert what in str(info.value)


def run_script(tmp_path: Path, body: str) -> subprocess.CompletedProcess:
    """Runs `body` in a fresh interpreter with the user module importable; a hang fails
    the test (timeout) instead of hanging the suite."""
    script = f"import sys\nsys.path.insert(0, {str(tmp_path / 'usermods')!r})\n" + body
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, env=dict(os.environ))


@pytest.mark.parametrize("fn, batched", [("slow", False), ("encode_batch", True),
                                         ("count_states", False)])
def test_exit_with_loaders_running_python_is_clean(data, tmp_path, fn, batched):
    # Loaders still alive (and busy, for `slow`) when the interpreter exits: their pool
    # threads hold kept thread states; no crash, no hang, exit status 0.
    cfg = config(data, {"python": "braid_user_tx:" + fn, "columns": ["text"],
                        "batched": batched}, on_error="skip", workers=3)
    proc = run_script(tmp_path, textwrap.dedent(f"""
        import json
        import braid
        from braid import _core
        cfg = json.loads({json.dumps(json.dumps(cfg))})
        loaders = [braid.Loader(cfg, rank=r, world_size=2) for r in (0, 1)]
        its = [iter(l) for l in loaders]
        for it in its:
            next(it)
        assert _core._kept_thread_states() > 0
        print("done", flush=True)
        """))
    assert proc.returncode == 0, proc.stderr
    assert "done" in proc.stdout
    assert "Fatal" not in proc.stderr, proc.stderr


def test_dropped_loader_frees_its_threads_states(data, tmp_path):
    # Dropped by Python (the GIL held): the pool joins with the GIL released, so its
    # threads can free their states, and none is left behind.
    cfg = config(data, {"python": "braid_user_tx:encode", "columns": ["text"]},
                 on_error="skip", workers=3)
    proc = run_script(tmp_path, textwrap.dedent(f"""
        import json
        import braid
        from braid import _core
        cfg = json.loads({json.dumps(json.dumps(cfg))})
        for round in range(3):
            loader = braid.Loader(cfg, rank=0, world_size=2)
            it = iter(loader)
            next(it)
            kept = _core._kept_thread_states()
            assert kept > 0, kept
            del it
            loader._engine = None
            assert _core._kept_thread_states() == 0, _core._kept_thread_states()
        print("done", flush=True)
        """))
    assert proc.returncode == 0, proc.stderr
    assert "done" in proc.stdout


def test_exit_while_daemon_threads_pull_batches_is_clean(data, tmp_path):
    # Daemon threads blocked in next() (the GIL released) while the pool threads call
    # Python when the main thread exits: no crash, no hang.
    tx = {"python": "braid_user_tx:slow", "columns": ["text"]}
    txb = {"python": "braid_user_tx:encode_batch", "columns": ["text"], "batched": True}
    cfgs = [config(data, t, on_error="skip", workers=3) for t in (tx, txb)]
    proc = run_script(tmp_path, textwrap.dedent(f"""
        import json, threading
        import braid
        cfgs = json.loads({json.dumps(json.dumps(cfgs))})
        started = [threading.Event() for _ in cfgs]

        def pull(cfg, event):
            it = iter(braid.Loader(cfg, rank=0, world_size=2))
            while True:
                next(it)
                event.set()

        for cfg, event in zip(cfgs, started):
            threading.Thread(target=pull, args=(cfg, event), daemon=True).start()
        assert all(e.wait(60) for e in started)
        print("done", flush=True)
        """))
    assert proc.returncode == 0, proc.stderr
    assert "done" in proc.stdout
    assert "Fatal" not in proc.stderr, proc.stderr
