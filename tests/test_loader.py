"""braid.Loader: tensors, exact delivery, TP copies, resume."""

from __future__ import annotations

import itertools
import json
from collections import defaultdict

import pytest
import torch

import braid
from conftest import write_config


def take(loader, n):
    return list(itertools.islice(iter(loader), n))


def decode(token: int):
    """(source, doc, offset) encoded by conftest.doc_tokens."""
    source, rest = divmod(token, 10_000_000)
    doc, offset = divmod(rest, 1000)
    return source, doc, offset


def test_batches_have_the_documented_tensors(small_dataset):
    loader = braid.Loader(small_dataset["config"], rank=0, world_size=2)
    batch = take(loader, 1)[0]
    assert set(batch) == {"input_ids", "labels", "loss_mask", "position_ids", "cu_seqlens",
                          "max_seqlen", "source_ids"}
    for name in ("input_ids", "labels", "position_ids"):
        assert batch[name].dtype == torch.int64 and batch[name].shape == (1, 32)
    assert batch["loss_mask"].dtype == torch.float32
    assert batch["source_ids"].dtype == torch.int32
    assert batch["cu_seqlens"].dtype == torch.int32
    assert batch["cu_seqlens"][0] == 0 and batch["cu_seqlens"][-1] == 32


def test_tokens_labels_positions_follow_the_documents(small_dataset):
    docs = small_dataset["docs"]
    loader = braid.Loader(small_dataset["config"], rank=1, world_size=2)
    for batch in take(loader, 12):
        ids = batch["input_ids"][0].tolist()
        labels = batch["labels"][0].tolist()
        pos = batch["position_ids"][0].tolist()
        mask = batch["loss_mask"][0].tolist()
        src = batch["source_ids"][0].tolist()
        cu = batch["cu_seqlens"].tolist()
        for a, b in zip(cu, cu[1:]):
            assert b > a
            source, doc, first = decode(ids[a])
            tokens = docs[source][doc]
            for k in range(a, b):
                assert decode(ids[k]) == (source, doc, first + k - a)
                assert pos[k] == k - a
                assert src[k] == source
                offset = first + k - a
                if offset + 1 < len(tokens):
                    assert labels[k] == tokens[offset + 1] and mask[k] == 1.0
                else:
                    assert labels[k] == -100 and mask[k] == 0.0


def test_every_token_arrives_once_over_the_dp_ranks(small_dataset):
    docs = small_dataset["docs"]
    # 15 steps of 128 tokens stay inside the first epoch of both sources.
    steps = 15
    for source, weight in ((0, 0.7), (1, 0.3)):
        assert sum(len(t) for t in docs[source].values()) > steps * 128 * weight + 1
    seen = defaultdict(int)
    for rank in (0, 1):
        loader = braid.Loader(small_dataset["config"], rank=rank, world_size=2)
        for batch in take(loader, steps * loader.micro_batches_per_step):
            for token in batch["input_ids"][0].tolist():
                seen[decode(token)] += 1
    assert sum(seen.values()) == steps * 2 * 2 * 32
    assert set(seen.values()) == {1}, "a token was delivered twice"
    # Documents are consumed in order: each is complete, except at most one per source
    # (the one the last step cut), which is a prefix.
    offsets = defaultdict(set)
    for source, doc, offset in seen:
        offsets[(source, doc)].add(offset)
    partial = defaultdict(int)
    for (source, doc), got in offsets.items():
        n = len(docs[source][doc])
        assert got == set(range(len(got))), (source, doc)
        if len(got) < n:
            partial[source] += 1
    assert all(v <= 1 for v in partial.values()), partial


def test_tp_ranks_of_one_dp_group_get_the_same_batches(small_dataset):
    config = dict(small_dataset["config"], topology={"dp": 2, "tp": 2, "pp": 1, "cp": 1})
    a = take(braid.Loader(config, rank=2, world_size=4), 4)  # dp 1, tp 0
    b = take(braid.Loader(config, rank=3, world_size=4), 4)  # dp 1, tp 1
    c = take(braid.Loader(config, rank=0, world_size=4), 4)  # dp 0
    for x, y in zip(a, b):
        assert all(torch.equal(x[k], y[k]) for k in x)
    assert not all(torch.equal(x["input_ids"], z["input_ids"]) for x, z in zip(a, c))


@pytest.mark.parametrize("consumed", [1, 2, 5, 8])
def test_resume_continues_exactly(small_dataset, consumed):
    config = small_dataset["config"]
    reference = take(braid.Loader(config, rank=0, world_size=2), consumed + 6)

    first = braid.Loader(config, rank=0, world_size=2)
    it = iter(first)
    for _ in range(consumed):
        next(it)
    state = json.loads(json.dumps(first.state_dict()))  # plain JSON-able values

    resumed = braid.Loader(config, rank=0, world_size=2)
    resumed.load_state_dict(state)
    rest = take(resumed, 6)
    for want, got in zip(reference[consumed:], rest):
        for name in want:
            assert torch.equal(want[name], got[name]), name


def test_config_file_path_and_dict_give_the_same_stream(small_dataset, tmp_path):
    path = write_config(tmp_path / "job.json", small_dataset["config"])
    a = take(braid.Loader(str(path), rank=0, world_size=2), 3)
    b = take(braid.Loader(small_dataset["config"], rank=0, world_size=2), 3)
    for x, y in zip(a, b):
        assert torch.equal(x["input_ids"], y["input_ids"])


def test_state_of_another_config_is_refused(small_dataset):
    loader = braid.Loader(small_dataset["config"], rank=0, world_size=2)
    take(loader, 2)
    state = loader.state_dict()
    other = dict(small_dataset["config"], seed=12)
    with pytest.raises(braid.ConfigError, match="state.fingerprint"):
        braid.Loader(other, rank=0, world_size=2).load_state_dict(state)


def test_a_position_outside_the_source_is_a_config_error_naming_it(small_dataset):
    loader = braid.Loader(small_dataset["config"], rank=0, world_size=2)
    take(loader, 2)
    state = loader.state_dict()
    state["sources"][1]["window"] = 1000  # the same config, a position its files lack
    resumed = braid.Loader(small_dataset["config"], rank=0, world_size=2)
    resumed.load_state_dict(state)
    with pytest.raises(braid.ConfigError, match=r"sources\[1\]: stream position .* lies "
                       r"outside the source") as info:
        next(iter(resumed))
    assert type(info.value) is braid.ConfigError


def test_close_stops_the_engine_and_a_new_iterator_continues(small_dataset):
    reference = take(braid.Loader(small_dataset["config"], rank=0, world_size=2), 5)
    loader = braid.Loader(small_dataset["config"], rank=0, world_size=2)
    it = iter(loader)
    got = [next(it), next(it)]
    loader.close()
    assert list(it) == []  # the closed iterator ends
    loader.close()  # idempotent
    got += take(loader, 3)
    for want, have in zip(reference, got):
        assert torch.equal(want["input_ids"], have["input_ids"])


def test_statuses_without_detail_are_braid_errors():
    from braid import _core

    with pytest.raises(braid.ConfigError, match="rgb: must hold"):
        _core.encode_test_jpeg(b"x", 1, 1)
    # The JPEG encoder refuses an empty image with a status that carries no detail: the
    # binding's table still makes it a braid error, never a bare ValueError/RuntimeError.
    with pytest.raises(braid.DataError) as info:
        _core.encode_test_jpeg(b"", 0, 0)
    assert type(info.value) is braid.DataError


def test_wrong_world_size_names_the_topology(small_dataset):
    with pytest.raises(braid.ConfigError, match="world_size"):
        braid.Loader(small_dataset["config"], rank=0, world_size=3)
    with pytest.raises(braid.ConfigError, match="rank"):
        braid.Loader(small_dataset["config"], rank=2, world_size=2)


# --- Rank views (docs/parallelism.md): PP keys, TP copies, CP parts ---

def _topology(small_dataset, **sizes):
    return dict(small_dataset["config"], topology={"dp": 2, "tp": 1, "pp": 1, "cp": 1, **sizes})


def test_pipeline_stages_get_their_keys(small_dataset):
    config = _topology(small_dataset, pp=3)  # world 6; rank = dp + 2 * pp
    full = take(braid.Loader(_topology(small_dataset), rank=1, world_size=2), 3)
    want = {0: {"input_ids", "source_ids", "position_ids", "cu_seqlens", "max_seqlen"},
            1: {"position_ids", "cu_seqlens", "max_seqlen"},
            2: {"labels", "loss_mask", "position_ids", "cu_seqlens", "max_seqlen"}}
    for stage, keys in want.items():
        loader = braid.Loader(config, rank=1 + 2 * stage, world_size=6)
        assert (loader.dp_rank, loader.pp_rank) == (1, stage)
        for got, ref in zip(take(loader, 3), full):
            assert set(got) == keys, stage
            for k in keys:
                assert torch.equal(got[k], ref[k]), (stage, k)


def test_tp_ranks_get_identical_views_with_pp_and_cp(small_dataset):
    config = _topology(small_dataset, tp=2, pp=2, cp=2)  # world 16
    a = take(braid.Loader(config, rank=2 + 4 * 0 + 8 * 1, world_size=16), 3)  # cp 1, pp 1
    b = take(braid.Loader(config, rank=3 + 4 * 0 + 8 * 1, world_size=16), 3)
    for x, y in zip(a, b):
        assert set(x) == {"labels", "loss_mask", "position_ids", "cu_seqlens", "max_seqlen"}
        assert all(torch.equal(x[k], y[k]) for k in x)


@pytest.mark.parametrize("cp", [2, 4])
def test_cp_parts_reassemble_to_the_dp_ranks_batch(small_dataset, cp):
    config = _topology(small_dataset, cp=cp)  # rank = cp_rank + cp * dp
    full = take(braid.Loader(_topology(small_dataset), rank=1, world_size=2), 4)
    unsplit = take(braid.Loader(config, rank=cp, world_size=2 * cp, split_context=False), 4)
    parts = [take(braid.Loader(config, rank=r + cp, world_size=2 * cp), 4) for r in range(cp)]
    chunk = 32 // (2 * cp)
    for i, ref in enumerate(full):
        assert all(torch.equal(unsplit[i][k], ref[k]) for k in ref)
        for name in ("input_ids", "labels", "loss_mask", "position_ids", "source_ids"):
            pieces = [None] * (2 * cp)
            for r in range(cp):
                local = parts[r][i][name]
                assert local.shape == (1, 32 // cp)
                pieces[r] = local[:, :chunk]
                pieces[2 * cp - 1 - r] = local[:, chunk:]
            assert torch.equal(torch.cat(pieces, dim=1), ref[name]), name
        edges = set(ref["cu_seqlens"].tolist())
        for r in range(cp):
            cu = parts[r][i]["cu_seqlens"].tolist()
            assert cu[0] == 0 and cu[-1] == 32 // cp
            assert all(a < b for a, b in zip(cu, cu[1:]))
            for local in cu[1:-1]:
                if local == chunk:
                    continue  # the edge between the rank's two chunks
                k = r if local < chunk else 2 * cp - 1 - r
                assert k * chunk + local % chunk in edges, (r, local)


def test_cp_needs_seq_len_divisible_by_twice_cp(small_dataset):
    with pytest.raises(braid.ConfigError, match="batch.seq_len"):
        braid.Loader(_topology(small_dataset, cp=3), rank=0, world_size=6)


def test_new_iterator_continues_the_stream(small_dataset):
    reference = take(braid.Loader(small_dataset["config"], rank=0, world_size=2), 5)
    loader = braid.Loader(small_dataset["config"], rank=0, world_size=2)
    got = take(loader, 2) + take(loader, 3)
    for want, have in zip(reference, got):
        assert torch.equal(want["input_ids"], have["input_ids"])


def test_one_engine_serves_several_ranks_from_one_build(small_dataset):
    import numpy as np
    from braid import _core
    config = braid.load_config(_topology(small_dataset, tp=2, pp=2))
    engine = _core.make_engine(config, [1])
    reference = _core.make_engine(config, [1])
    for _ in range(3):
        full = reference.next()
        tp0, tp1, last = engine.next_views([(0, 0, 0), (1, 0, 0), (0, 1, 0)])
        assert set(tp0) == {"input_ids", "source_ids", "position_ids", "cu_seqlens",
                            "max_seqlen"}
        assert set(last) == {"labels", "loss_mask", "position_ids", "cu_seqlens",
                             "max_seqlen"}
        for name in tp0:
            assert np.array_equal(tp0[name], full[name])
            assert np.shares_memory(tp0[name], tp1[name]), name  # one build, no copy
        assert np.shares_memory(tp0["position_ids"], last["position_ids"])
        assert np.array_equal(last["labels"], full["labels"])


@pytest.mark.parametrize("consumed", [3, 5, 9])
def test_resume_inside_a_phase_with_another_seq_len(small_dataset, consumed):
    # Steps 0-2 use 16-token sequences: 4 micro-batches per rank instead of 2.
    config = dict(small_dataset["config"], phases=[{"until_step": 3, "seq_len": 16}])
    loader = braid.Loader(config, rank=0, world_size=2)
    assert loader.micro_batches_at(0) == 4 and loader.micro_batches_at(3) == 2
    reference = take(braid.Loader(config, rank=0, world_size=2), consumed + 5)
    assert reference[0]["input_ids"].shape == (1, 16)
    assert reference[-1]["input_ids"].shape == (1, 32 if consumed + 5 > 12 else 16)

    first = braid.Loader(config, rank=0, world_size=2)
    it = iter(first)
    for _ in range(consumed):
        next(it)
    resumed = braid.Loader(config, rank=0, world_size=2)
    resumed.load_state_dict(first.state_dict())
    for want, got in zip(reference[consumed:], take(resumed, 5)):
        for name in want:
            assert torch.equal(want[name], got[name]), name


def _step_tokens(config, world_size, steps):
    """Per step, the sorted input tokens of every rank that has its own bucket."""
    per_step = defaultdict(list)
    seen_buckets = set()
    for rank in range(world_size):
        loader = braid.Loader(config, rank=rank, world_size=world_size)
        if loader.bucket in seen_buckets:
            continue
        seen_buckets.add(loader.bucket)
        n = loader.micro_batches_per_step
        for i, batch in enumerate(take(loader, steps * n)):
            per_step[i // n] += batch["input_ids"].flatten().tolist()
    return {step: sorted(tokens) for step, tokens in per_step.items()}, seen_buckets


def test_distribute_world_gives_every_rank_its_own_bucket_of_the_same_step(small_dataset):
    # dp 2 x tp 2: by default TP ranks share; with distribute: world each of the four
    # ranks gets its own bucket, and the documents of each step are the same.
    base = dict(small_dataset["config"], topology={"dp": 2, "tp": 2})
    world = dict(small_dataset["config"], topology={"dp": 2, "tp": 2, "distribute": "world"})
    a, buckets_a = _step_tokens(base, 4, steps=4)
    b, buckets_b = _step_tokens(world, 4, steps=4)
    assert buckets_a == {0, 1} and buckets_b == {0, 1, 2, 3}
    assert a == b
    loaders = [braid.Loader(world, rank=r, world_size=4) for r in range(4)]
    assert [loader.bucket for loader in loaders] == [0, 1, 2, 3]
    assert loaders[0].micro_batches_per_step == 1  # 4 sequences over 4 buckets
    firsts = [take(loader, 1)[0]["input_ids"] for loader in loaders]
    assert not torch.equal(firsts[0], firsts[1])  # TP ranks 0 and 1 differ now
    assert braid.Loader(world, rank=0, world_size=4)._config.topology["buckets"] == 4


def test_topology_order_changes_which_rank_is_which(small_dataset):
    config = dict(small_dataset["config"],
                  topology={"dp": 2, "tp": 2, "order": ["dp", "tp", "cp", "pp"]})
    loader = braid.Loader(config, rank=1, world_size=4)
    assert (loader.dp_rank, loader.tp_rank) == (1, 0)
    default = dict(small_dataset["config"], topology={"dp": 2, "tp": 2})
    megatron = braid.Loader(default, rank=2, world_size=4)
    assert (megatron.dp_rank, megatron.tp_rank) == (1, 0)
    a = take(loader, 3)
    b = take(megatron, 3)
    for x, y in zip(a, b):
        assert all(torch.equal(x[k], y[k]) for k in x)
    bad = dict(small_dataset["config"], topology={"dp": 2, "order": ["dp", "dp", "cp", "pp"]})
    with pytest.raises(braid.ConfigError, match=r"topology.order\[1\]"):
        braid.Loader(bad, rank=0, world_size=2)
