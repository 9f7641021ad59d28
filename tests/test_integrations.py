"""Trainer integrations: Megatron-LM's external iterator and torchdata's StatefulDataLoader.

Neither trainer library is needed for the Megatron tests: Megatron's own steps (the CP
split of get_batch_on_this_cp_rank, which ranks read data) are re-stated here in torch.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import braid
from braid.integrations import megatron
from braid.integrations.stateful import stateful_dataloader


def take(iterable, n):
    return list(itertools.islice(iter(iterable), n))


def with_topology(small_dataset, **sizes):
    return dict(small_dataset["config"], topology={"dp": 2, "tp": 1, "pp": 1, "cp": 1, **sizes})


# --- Megatron ---

def test_megatron_batches_have_megatrons_keys_and_values(small_dataset):
    config = small_dataset["config"]
    raw = take(braid.Loader(config, rank=1, world_size=2), 4)
    batches = take(megatron.MegatronBatches(braid.Loader(config, rank=1, world_size=2)), 4)
    assert any((b["labels"] == -100).any() for b in raw), "fixture has document ends"
    for want, got in zip(raw, batches):
        # No attention_mask key: Megatron 0.16's get_batch_on_this_tp_rank calls .cuda()
        # on every key present.
        assert set(got) == {"tokens", "labels", "loss_mask", "position_ids", "cu_seqlens",
                            "cu_seqlens_padded", "max_seqlen"}
        assert torch.equal(got["tokens"], want["input_ids"].to(torch.int64))
        assert got["tokens"].dtype == got["labels"].dtype == torch.int64
        assert torch.equal(got["position_ids"], want["position_ids"].to(torch.int64))
        # Megatron's packed path: cu_seqlens int32 [1, n] (it asserts shape[0] == 1),
        # max_seqlen [1] (it reads max_seqlen[0]).
        assert got["cu_seqlens"].dtype == torch.int32
        assert torch.equal(got["cu_seqlens"], want["cu_seqlens"].reshape(1, -1))
        assert torch.equal(got["cu_seqlens_padded"], got["cu_seqlens"])
        assert torch.equal(got["loss_mask"], want["loss_mask"])
        ignored = want["labels"] < 0
        assert (got["labels"] >= 0).all()
        assert torch.equal(got["labels"][~ignored], want["labels"][~ignored].to(torch.int64))
        assert (got["loss_mask"][ignored] == 0).all()
        cu = want["cu_seqlens"]
        assert got["max_seqlen"].shape == (1,) and got["max_seqlen"].dtype == torch.int32
        assert int(got["max_seqlen"][0]) == int((cu[1:] - cu[:-1]).max())


def test_causal_block_mask_allows_earlier_tokens_of_the_same_document():
    cu = torch.tensor([0, 3, 4, 8, 10, 16], dtype=torch.int32)  # mbs 2, seq 8
    mask = megatron.causal_block_mask(cu, mbs=2, seq_len=8)
    assert mask.shape == (2, 1, 8, 8) and mask.dtype == torch.bool
    doc = [0, 0, 0, 1, 2, 2, 2, 2, 3, 3, 4, 4, 4, 4, 4, 4]
    for row in range(2):
        for i in range(8):
            for j in range(8):
                allowed = j <= i and doc[row * 8 + i] == doc[row * 8 + j]
                assert bool(mask[row, 0, i, j]) == (not allowed), (row, i, j)


def test_megatron_causal_mask_follows_the_batch(small_dataset):
    it = megatron.MegatronBatches(braid.Loader(small_dataset["config"], rank=0, world_size=2),
                                  attention_mask="causal")
    batch = next(it)
    mask = batch["attention_mask"]
    assert mask.shape == (1, 1, 32, 32)
    pos = batch["position_ids"][0]
    # A token sees exactly itself and the earlier tokens of its document: pos + 1 tokens.
    assert torch.equal((~mask[0, 0]).sum(dim=1), pos + 1)


def test_tp0_of_every_stage_reads_every_key(small_dataset):
    # Megatron's TP rank 0 reads tokens, labels and loss_mask on the first and the last
    # stage alike, and (megatron-core >= 0.18, packed) cu_seqlens on middle stages.
    config = with_topology(small_dataset, tp=2, pp=3)  # world 12; rank = tp + 2*(dp + 2*pp)
    readers = set()
    for rank in range(12):
        loader = braid.Loader(config, rank=rank, world_size=12)
        it = megatron.data_iterator(config, rank=rank, world_size=12)
        assert (it is not None) == megatron.needs_data(loader)
        if it is not None:
            readers.add((loader.tp_rank, loader.pp_rank))
    assert readers == {(0, 0), (0, 1), (0, 2)}
    stages = [take(megatron.data_iterator(config, rank=2 + 4 * pp, world_size=12), 3)
              for pp in range(3)]  # dp 1, pp 0 / 1 / 2
    whole = take(megatron.MegatronBatches(braid.Loader(
        with_topology(small_dataset), rank=1, world_size=2)), 3)  # dp 1 of the same job
    for stage in stages:
        for want, got in zip(whole, stage):
            assert set(got) == set(want)
            for key in want:
                assert torch.equal(got[key], want[key]), key


def megatron_cp_split(tensor, cp, cp_rank):
    """Megatron's get_batch_on_this_cp_rank for a [b, s] tensor (seq_dim 1)."""
    b, s = tensor.shape
    view = tensor.view(b, 2 * cp, s // (2 * cp))
    index = torch.tensor([cp_rank, 2 * cp - cp_rank - 1])
    return view.index_select(1, index).reshape(b, -1)


def test_megatron_cp_split_of_whole_sequences_equals_braids_cp_view(small_dataset):
    cp = 2
    config = with_topology(small_dataset, cp=cp)  # rank = cp_rank + 2 * dp
    with pytest.raises(ValueError, match="split_context=False"):
        megatron.MegatronBatches(braid.Loader(config, rank=0, world_size=4))
    whole = take(megatron.data_iterator(config, rank=2, world_size=4, packed=False),
                 3)  # dp 1, cp 0
    assert whole[0]["tokens"].shape == (1, 32)
    for cp_rank in range(cp):
        braid_view = take(megatron.MegatronBatches(
            braid.Loader(config, rank=2 + cp_rank, world_size=4), cp_split="braid",
            packed=False), 3)
        for w, v in zip(whole, braid_view):
            for key in ("tokens", "labels", "loss_mask", "position_ids"):
                assert torch.equal(megatron_cp_split(w[key], cp, cp_rank), v[key]), key


# --- torchdata StatefulDataLoader and the plain DataLoader ---

def test_loader_in_a_plain_dataloader_resumes_through_its_state(small_dataset):
    config = small_dataset["config"]
    reference = take(torch.utils.data.DataLoader(
        braid.Loader(config, rank=0, world_size=2), batch_size=None, num_workers=0), 9)
    loader = braid.Loader(config, rank=0, world_size=2)
    first = take(torch.utils.data.DataLoader(loader, batch_size=None, num_workers=0), 4)
    state = json.loads(json.dumps(loader.state_dict()))
    resumed = braid.Loader(config, rank=0, world_size=2)
    resumed.load_state_dict(state)
    rest = take(torch.utils.data.DataLoader(resumed, batch_size=None, num_workers=0), 5)
    for want, got in zip(reference, first + rest):
        assert set(want) == set(got)
        for k in want:
            assert torch.equal(want[k], got[k]), k


@pytest.mark.skipif(importlib.util.find_spec("torchdata") is None,
                    reason="torchdata is not installed")
@pytest.mark.parametrize("consumed", [1, 3, 6])
def test_stateful_dataloader_resume_equals_the_uninterrupted_stream(small_dataset, consumed):
    config = small_dataset["config"]
    reference = take(stateful_dataloader(braid.Loader(config, rank=1, world_size=2)),
                     consumed + 5)
    dl = stateful_dataloader(braid.Loader(config, rank=1, world_size=2))
    it = iter(dl)
    for _ in range(consumed):
        next(it)
    state = dl.state_dict()
    assert state["dataset_state"] is not None  # the Loader's own state, no fast-forward
    json.dumps(state["dataset_state"])

    resumed = stateful_dataloader(braid.Loader(config, rank=1, world_size=2))
    resumed.load_state_dict(state)
    rest = take(resumed, 5)
    for want, got in zip(reference[consumed:], rest):
        for k in want:
            assert torch.equal(want[k], got[k]), k
    with pytest.raises(ValueError, match="num_workers"):
        stateful_dataloader(braid.Loader(config, rank=1, world_size=2), num_workers=2)


# --- The examples run as shipped ---

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.mark.parametrize("name,needs", [("megatron_iterator.py", None),
                                        ("torchdata_resume.py", "torchdata")])
def test_example_runs(name, needs, tmp_path):
    if needs and importlib.util.find_spec(needs) is None:
        pytest.skip(f"{needs} is not installed")
    # The braid under test (e.g. a staged build on a relative PYTHONPATH) from any cwd.
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(braid.__file__)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [package_root] + [p for p in [os.environ.get("PYTHONPATH")] if p])}
    done = subprocess.run([sys.executable, str(EXAMPLES / name)], capture_output=True,
                          text=True, cwd=tmp_path, timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    if name == "megatron_iterator.py":
        assert done.stdout.count("no data") == 4  # the TP rank 1 of each (dp, pp)
    else:
        assert "equals the uninterrupted one: True" in done.stdout


# --- torchtitan's loader contract without torchtitan installed ---

def test_torchtitan_loader_keeps_its_contract_without_torchtitan(small_dataset, tmp_path):
    config = dict(small_dataset["config"], topology={"dp": 1, "tp": 1, "pp": 1, "cp": 1})
    path = tmp_path / "job.json"
    path.write_text(json.dumps(config))
    script = f"""
import sys, json
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "torchtitan":
            raise ImportError("torchtitan is not installed")
sys.meta_path.insert(0, Block())
from braid.integrations.torchtitan import BraidDataLoader
dl = BraidDataLoader.Config(config={str(path)!r}).build(
    dp_world_size=2, dp_rank=1, tokenizer=None, seq_len=32, local_batch_size=1)
it = iter(dl)
inputs, labels = next(it)
state = dl.state_dict()
resumed = BraidDataLoader.Config(config={str(path)!r}).build(dp_world_size=2, dp_rank=1)
resumed.load_state_dict(state)
print(json.dumps({{"bases": [c.__name__ for c in BraidDataLoader.__mro__],
    "keys": sorted(inputs), "shape": list(labels.shape), "state": sorted(state),
    "resumed": bool((next(iter(resumed))[0]["input"] == next(it)[0]["input"]).all())}}))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.splitlines()[-1])
    assert "BaseDataLoader" not in got["bases"]
    assert got["keys"] == ["input", "positions"] and got["shape"] == [1, 32]
    assert got["state"] == ["dp_rank_1", "world_size"] and got["resumed"]
