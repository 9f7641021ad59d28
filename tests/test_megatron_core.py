"""Braid's Megatron batches through megatron-core's own functions (megatron-core 0.16).

Called on CPU: ``get_thd_batch_on_this_cp_rank`` and ``PackedSeqParams`` (the packed THD
path of Megatron-LM's ``get_batch``) for cp 1 and 2 (with ``batch.pad_to_multiple_of:
2*cp``, on every batch), ``get_batch_on_this_cp_rank`` (the
unpacked path) for cp 2, on the batches of every (tp, pp) rank of tp 2 x pp 2 and pp 3
jobs. Megatron-LM's ``get_batch_on_this_tp_rank`` lives in its training package, not in
megatron-core: what its TP rank 0 reads and asserts is restated in ``tp0_reads``.
For cp 2 the THD split calls Transformer Engine's ``thd_get_partitioned_indices``, which
has no CPU build: ``te_partitioned_indices`` restates it (each padded piece cut into 2*cp
chunks, rank r taking chunks r and 2*cp-1-r) and is put in its place.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import types
import warnings

import pytest
import torch

pytestmark = pytest.mark.skipif(importlib.util.find_spec("megatron") is None
                                or importlib.util.find_spec("megatron.core") is None,
                                reason="megatron-core is not installed")

import braid  # noqa: E402
from braid.integrations import megatron  # noqa: E402



@pytest.fixture(scope="module")
def mcore():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core import utils
        from megatron.core.packed_seq_params import PackedSeqParams
    return types.SimpleNamespace(utils=utils, PackedSeqParams=PackedSeqParams)


@pytest.fixture
def one_process_group(tmp_path):
    """megatron-core's get_pg_size / get_pg_rank read a group only once torch.distributed
    is initialized."""
    torch.distributed.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    torch.distributed.destroy_process_group()


class FakeGroup:
    """A process group's size and rank, for megatron-core's CP split on one process."""

    def __init__(self, size: int, rank: int) -> None:
        self._size, self._rank = size, rank

    def size(self) -> int:
        return self._size

    def rank(self) -> int:
        return self._rank


def te_partitioned_indices(cu_seqlens_padded, total_tokens, cp_size, cp_rank):
    cu = cu_seqlens_padded.reshape(-1).tolist()
    assert all(c % (2 * cp_size) == 0 for c in cu)  # TE's kernel asserts the same
    out = []
    for start, end in zip(cu[:-1], cu[1:]):
        chunk = (end - start) // (2 * cp_size)
        for c in (cp_rank, 2 * cp_size - 1 - cp_rank):
            out.extend(range(start + c * chunk, start + (c + 1) * chunk))
    return torch.tensor(out, dtype=torch.int64)


def tp0_reads(data):
    """Megatron-LM 0.16 get_batch_on_this_tp_rank on TP rank 0: what it reads and asserts."""
    batch = {
        "tokens": data["tokens"].to("cpu"), "labels": data["labels"].to("cpu"),
        "loss_mask": data["loss_mask"].to("cpu"),
        "attention_mask": None if "attention_mask" not in data else
        data["attention_mask"].to("cpu"),
        "position_ids": data["position_ids"].to("cpu"),
        "cu_seqlens": None if "cu_seqlens" not in data else data["cu_seqlens"].to("cpu"),
        "max_seqlen": None if "max_seqlen" not in data else data["max_seqlen"].to("cpu"),
    }
    if batch["cu_seqlens"] is not None:
        assert batch["cu_seqlens"].dtype == torch.int32
        assert batch["cu_seqlens"].shape[0] == 1, "micro-batch-size must be 1 for packing"
    return batch


def pretrain_gpt_get_batch(mcore, data, cp_size=1, cp_rank=0):
    """Megatron-LM 0.16 pretrain_gpt.get_batch after the TP broadcast (packed path)."""
    batch = dict(tp0_reads(data))
    batch["cu_seqlens_padded"] = data.get("cu_seqlens_padded")
    cu_seqlens = batch.pop("cu_seqlens", None)
    cu_seqlens_padded = batch.pop("cu_seqlens_padded", None)
    max_seqlen = batch.pop("max_seqlen", None)
    assert max_seqlen.dim() == 1
    return mcore.utils.get_thd_batch_on_this_cp_rank(
        batch, cu_seqlens, cu_seqlens_padded, max_seqlen, cp_size=cp_size, cp_rank=cp_rank)


def take(iterable, n):
    return list(itertools.islice(iter(iterable), n))


def with_topology(config, **sizes):
    return dict(config, topology={"dp": 2, "tp": 1, "pp": 1, "cp": 1, **sizes})


@pytest.mark.parametrize("tp,pp", [(2, 2), (1, 3)])
def test_thd_batch_and_packed_seq_params_on_every_stage(small_dataset, mcore, tp, pp):
    config = with_topology(small_dataset["config"], tp=tp, pp=pp)
    world = 2 * tp * pp
    for rank in range(world):
        it = megatron.data_iterator(config, rank=rank, world_size=world)
        loader = braid.Loader(config, rank=rank, world_size=world)
        if loader.tp_rank != 0:
            assert it is None  # Megatron broadcasts to TP ranks > 0
            continue
        for data in take(it, 3):
            batch, params = pretrain_gpt_get_batch(mcore, data)
            assert isinstance(params, mcore.PackedSeqParams) and params.qkv_format == "thd"
            cu = data["cu_seqlens"]
            assert params.cu_seqlens_q is cu and params.cu_seqlens_kv_padded is cu
            assert params.max_seqlen_q == int((cu[0, 1:] - cu[0, :-1]).max())
            assert int(cu[0, -1]) == batch["tokens"].numel()
            for key in ("tokens", "labels", "loss_mask", "position_ids"):
                assert batch[key].shape == (1, 32), key


def test_megatron_core_cp_split_of_whole_sequences_is_braids_cp_view(
        small_dataset, mcore, one_process_group):
    cp = 2
    config = with_topology(small_dataset["config"], cp=cp)  # rank = cp_rank + 2 * dp
    for cp_rank in range(cp):
        whole = take(megatron.data_iterator(config, rank=2 + cp_rank, world_size=4,
                                            packed=False, attention_mask="causal"), 3)
        view = take(braid.Loader(config, rank=2 + cp_rank, world_size=4), 3)
        for data, want in zip(whole, view):
            batch = mcore.utils.get_batch_on_this_cp_rank(
                dict(tp0_reads(data)), cp_group=FakeGroup(cp, cp_rank))
            assert torch.equal(batch["tokens"], want["input_ids"].to(torch.int64))
            assert torch.equal(batch["position_ids"], want["position_ids"].to(torch.int64))
            assert torch.equal(batch["loss_mask"], want["loss_mask"])
            assert batch["attention_mask"].shape == (1, 1, 32 // cp, 32)


def test_thd_cp2_split_covers_every_token_once(small_dataset, mcore, monkeypatch):
    """Batches whose pieces are multiples of 2*cp go through Megatron's THD CP split;
    the adapter refuses the others (next test)."""
    monkeypatch.setattr(mcore.utils, "tex", types.SimpleNamespace(
        thd_get_partitioned_indices=te_partitioned_indices))
    monkeypatch.setattr(mcore.utils, "is_te_min_version", lambda *a, **k: True)
    cp = 2
    config = with_topology(small_dataset["config"], cp=cp)
    convert = megatron.data_iterator(config, rank=2, world_size=4)  # dp 1, cp 0
    raws = take(braid.Loader(config, rank=2, world_size=4, split_context=False,
                             stage_view=False), 40)
    fit = [r for r in raws
           if not ((r["cu_seqlens"][1:] - r["cu_seqlens"][:-1]) % (2 * cp)).any()]
    assert 0 < len(fit) < len(raws), "the fixture has batches of both kinds"
    for raw in fit:
        seen = []
        for cp_rank in range(cp):
            data = convert.convert(raw)
            tokens = data["tokens"].clone()
            batch, params = pretrain_gpt_get_batch(mcore, data, cp_size=cp, cp_rank=cp_rank)
            assert params.cu_seqlens_q_padded is data["cu_seqlens_padded"]
            assert batch["tokens"].shape == (1, 32 // cp)
            index = te_partitioned_indices(data["cu_seqlens_padded"], 32, cp, cp_rank)
            assert torch.equal(batch["tokens"][0], tokens[0, index])
            seen.extend(index.tolist())
        assert sorted(seen) == list(range(32))


def test_thd_cp2_refuses_pieces_that_are_not_a_multiple_of_2cp(small_dataset):
    config = with_topology(small_dataset["config"], cp=2)
    it = megatron.data_iterator(config, rank=0, world_size=4)
    with pytest.raises(ValueError, match="batch.pad_to_multiple_of: 4"):
        take(it, 8)


def planned_pieces(config, steps):
    """Per (step, dp), the planned micro-batches' pieces (source, file, row, start, len),
    from the planner's JSON (``braid plan``)."""
    from braid import _core
    from braid.config import load_config

    lines = []
    _core.plan_job(load_config(config), steps, "", lines.append)
    names = [s["name"] for s in config["sources"]]
    out = {}
    for line in lines:
        step = json.loads(line)
        for rank in step["ranks"]:
            out[step["step"], rank["dp"]] = [
                [(names.index(d["src"]), d["file"], d["row"], d["start"], d["len"])
                 for d in mb["docs"]] for mb in rank["micro_batches"]]
    return out


def doc_of(small_dataset, source, file, row):
    """The document at (file, row) of the fixture's source: make_source puts the ids in
    sorted order into 2 files."""
    docs = small_dataset["docs"][source]
    per_file = (len(docs) + 1) // 2
    return docs[file * per_file + row]


@pytest.mark.parametrize("cp", [1, 2])
def test_thd_padded_pieces_through_megatron_cp_split(small_dataset, mcore, monkeypatch, cp):
    """batch.pad_to_multiple_of: 2*cp: every batch goes through megatron-core's THD path
    (get_thd_batch_on_this_cp_rank, PackedSeqParams); each CP rank receives exactly
    chunks r and 2*cp-1-r of every padded piece of the planned documents, computed here
    from the documents and the plan alone."""
    monkeypatch.setattr(mcore.utils, "tex", types.SimpleNamespace(
        thd_get_partitioned_indices=te_partitioned_indices))
    monkeypatch.setattr(mcore.utils, "is_te_min_version", lambda *a, **k: True)
    config = with_topology(small_dataset["config"], cp=cp)
    config["batch"] = dict(config["batch"], pad_to_multiple_of=2 * cp)
    steps = 6
    plan = planned_pieces(config, steps)
    padded_seen = 0
    for dp in range(2):
        for cp_rank in range(cp):
            rank = dp * cp + cp_rank  # Megatron's order: tp, cp, dp, pp
            it = megatron.data_iterator(config, rank=rank, world_size=2 * cp)
            for step in range(steps):
                for pieces in plan[step, dp]:
                    data = next(it)
                    batch, params = pretrain_gpt_get_batch(mcore, data, cp_size=cp,
                                                           cp_rank=cp_rank)
                    assert isinstance(params, mcore.PackedSeqParams)
                    assert params.qkv_format == "thd"
                    want_tokens, want_pos, want_mask = [], [], []
                    cu_padded, cu_real = [0], [0]
                    for source, file, row, start, length in pieces:
                        doc = doc_of(small_dataset, source, file, row)
                        real = max(0, min(length, len(doc) - start))
                        assert 0 < real and length % (2 * cp) == 0
                        padded_seen += real < length
                        tokens = list(doc[start:start + real]) + [0] * (length - real)
                        # A target for every real token but the document's last.
                        mask = [1.0 if start + k + 1 < len(doc) else 0.0
                                for k in range(real)] + [0.0] * (length - real)
                        chunk = length // (2 * cp)
                        for c in (cp_rank, 2 * cp - 1 - cp_rank):
                            want_tokens += tokens[c * chunk:(c + 1) * chunk]
                            want_pos += list(range(c * chunk, (c + 1) * chunk))
                            want_mask += mask[c * chunk:(c + 1) * chunk]
                        cu_padded.append(cu_padded[-1] + length)
                        cu_real.append(cu_real[-1] + real)
                    assert cu_padded[-1] == 32, "the plan fills every sequence"
                    assert batch["tokens"][0].tolist() == want_tokens
                    assert batch["position_ids"][0].tolist() == want_pos
                    assert batch["loss_mask"][0].tolist() == want_mask
                    assert params.cu_seqlens_q[0].tolist() == cu_real
                    assert params.cu_seqlens_kv[0].tolist() == cu_real
                    assert params.cu_seqlens_q_padded[0].tolist() == cu_padded
                    assert params.cu_seqlens_kv_padded[0].tolist() == cu_padded
                    assert params.max_seqlen_q == max(
                        b - a for a, b in zip(cu_padded, cu_padded[1:]))
                    assert data["max_seqlen"].shape == (1,)
                    assert data["cu_seqlens"].shape == (1, len(pieces) + 1)
    assert padded_seen > 5, "the fixture pads some pieces"


def test_save_state_and_restore_state_as_megatron_calls_them(small_dataset, tmp_path):
    """--dataloader-save: TP rank 0 of the first stage saves; every stage restores."""
    config = with_topology(small_dataset["config"], tp=2, pp=2)  # world 8
    first = megatron.data_iterator(config, rank=2, world_size=8)   # dp 1, pp 0
    reference = take(megatron.data_iterator(config, rank=6, world_size=8), 7)  # dp 1, pp 1
    take(first, 4)
    # What maybe_save_dataloader_state writes (iteration 4, pipeline parallel).
    path = megatron.saved_state_path(str(tmp_path / "dl"), 4, dp_rank=1,
                                     pipeline_parallel=True)
    assert path.endswith("iter_0000004/mp_rank_00_000/train_dataloader_dprank001.pt")
    import os
    os.makedirs(os.path.dirname(path))
    torch.save({"dataloader_state_dict": first.save_state()}, path)
    json.dumps(first.save_state())
    last = megatron.data_iterator(config, rank=6, world_size=8,
                                  dataloader_save=str(tmp_path / "dl"), iteration=4)
    for want, got in zip(reference[4:], take(last, 3)):
        for key in want:
            assert torch.equal(want[key], got[key]), key
    with pytest.raises(FileNotFoundError):
        megatron.data_iterator(config, rank=6, world_size=8,
                               dataloader_save=str(tmp_path / "dl"), iteration=5)
