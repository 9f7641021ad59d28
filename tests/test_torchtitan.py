"""torchtitan's loader contract, against the real torchtitan package (0.3.0).

Built as torchtitan's trainer builds its dataloader (``config.dataloader.build(...)``),
checked for torchtitan's batch format, and checkpointed with DCP
(``torch.distributed.checkpoint``) as torchtitan's checkpointer does.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import pickle

import pytest
import torch

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torchtitan") is None,
                                reason="torchtitan is not installed")

import braid  # noqa: E402
from braid.integrations.torchtitan import BraidDataLoader  # noqa: E402


def take(iterable, n):
    return list(itertools.islice(iter(iterable), n))


@pytest.fixture
def job(small_dataset, tmp_path):
    config = dict(small_dataset["config"],
                  topology={"dp": 1, "tp": 1, "pp": 1, "cp": 1})  # dp comes from torchtitan
    path = tmp_path / "braid_job.json"
    path.write_text(json.dumps(config))
    return {"path": str(path), "config": config}


def build(job, dp_rank, dp_world_size=2, **kw):
    """As torchtitan's Trainer: config.dataloader.build(...)."""
    cfg = BraidDataLoader.Config(config=job["path"])
    return cfg.build(dp_world_size=dp_world_size, dp_rank=dp_rank, tokenizer=None,
                     seq_len=kw.pop("seq_len", 32), local_batch_size=kw.pop("local_batch_size", 1),
                     snapshot_every_n_steps=1, **kw)


def test_is_a_torchtitan_base_dataloader_built_from_its_config(job):
    from torch.distributed.checkpoint.stateful import Stateful
    from torchtitan.components.dataloader import BaseDataLoader

    dl = build(job, dp_rank=1)
    assert isinstance(dl, BaseDataLoader) and isinstance(dl, Stateful)
    assert (dl.dp_rank, dl.dp_world_size) == (1, 2)
    with pytest.raises(ValueError, match="seq_len"):
        build(job, dp_rank=0, seq_len=64)
    with pytest.raises(ValueError, match="local batch size"):
        build(job, dp_rank=0, local_batch_size=2)


def test_batches_are_torchtitans_format_and_braids_stream(job):
    IGNORE_INDEX = -100  # torchtitan.components.loss.IGNORE_INDEX (that module needs spmd_types)
    dl = build(job, dp_rank=1)
    config = dict(job["config"], topology={"dp": 2, "tp": 1, "pp": 1, "cp": 1})
    reference = take(braid.Loader(config, rank=1, world_size=2), 6)
    for (inputs, labels), want in zip(take(dl, 6), reference):
        assert set(inputs) == {"input", "positions"}
        for t in (inputs["input"], inputs["positions"], labels):
            assert t.dtype == torch.int64 and t.shape == (1, 32)
        assert torch.equal(inputs["input"], want["input_ids"].to(torch.int64))
        assert torch.equal(inputs["positions"], want["position_ids"].to(torch.int64))
        assert torch.equal(labels, want["labels"].to(torch.int64))
        # Labels are pre-shifted: inside a document, token t's label is token t+1.
        x, pos, y = inputs["input"][0], inputs["positions"][0], labels[0]
        same_doc = pos[1:] == pos[:-1] + 1
        assert torch.equal(y[:-1][same_doc], x[1:][same_doc])
        assert ((y == IGNORE_INDEX) | (y >= 0)).all()


def test_state_round_trip_per_dp_rank(job):
    reference = take(build(job, dp_rank=0), 8)
    dl = build(job, dp_rank=0)
    take(dl, 3)
    state = dl.state_dict()
    assert set(state) == {"dp_rank_0", "world_size"} and state["world_size"] == 2
    state = pickle.loads(pickle.dumps(state))
    resumed = build(job, dp_rank=0)
    resumed.load_state_dict(state)
    for (want_in, want_labels), (got_in, got_labels) in zip(reference[3:], take(resumed, 5)):
        assert torch.equal(want_in["input"], got_in["input"])
        assert torch.equal(want_labels, got_labels)
    fresh = build(job, dp_rank=0)
    fresh.load_state_dict({})  # torchtitan: an empty state is valid (nothing saved)
    assert torch.equal(next(iter(fresh))[0]["input"], reference[0][0]["input"])


def test_dcp_checkpoint_round_trip(job, tmp_path):
    import torch.distributed.checkpoint as dcp

    reference = take(build(job, dp_rank=1), 7)
    dl = build(job, dp_rank=1)
    take(dl, 4)
    dcp.save({"dataloader": dl}, checkpoint_id=str(tmp_path / "step-2"), no_dist=True)
    resumed = build(job, dp_rank=1)
    dcp.load({"dataloader": resumed}, checkpoint_id=str(tmp_path / "step-2"), no_dist=True)
    for (want, _), (got, _) in zip(reference[4:], take(resumed, 3)):
        assert torch.equal(want["input"], got["input"])


def test_resume_at_another_dp_size_continues_the_sample_stream(job):
    """Braid's stream does not depend on DP: the step after a checkpoint at dp 2 holds
    the same sequences at dp 1."""
    per_step = build(job, dp_rank=0).micro_batches_per_step  # per rank at dp 2
    two = [take(build(job, dp_rank=r), 3 * per_step) for r in range(2)]
    dl = build(job, dp_rank=0)
    take(dl, 2 * per_step)  # two whole steps
    state = dl.state_dict()
    one = build(job, dp_rank=0, dp_world_size=1)
    one.load_state_dict(state)  # its own key (dp_rank_0 of 1) is there: same step
    got = take(one, 2 * per_step)  # step 2 at dp 1: both ranks' micro-batches
    want = [b for r in range(2) for b in two[r][2 * per_step:]]
    def rows(items):
        return sorted(tuple(inputs["input"][0].tolist()) for inputs, _ in items)
    assert rows(got) == rows(want)
