"""Source transforms end to end: text tokenized with SentencePiece, chat loss masks."""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import braid
from braid import _core

WORDS = ("the data loader reads parquet files and mixes many sources into steps of tokens "
         "for training large language models with balanced ranks quick brown fox").split()


def sentences(n: int, seed: int) -> List[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 14))) + "."
            for _ in range(n)]


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    prefix = tmp_path_factory.mktemp("spm") / "tok"
    return _core.train_tiny_sentencepiece(sentences(300, 1), str(prefix), 150)


def tokenize(model: str, text: str) -> List[int]:
    return list(_core.sentencepiece_tokenize(model, text))


def config(model: str, source: Dict, seq_len: int = 64, bos: bool = False) -> Dict:
    return {
        "seed": 3,
        "topology": {"dp": 1, "tp": 1, "pp": 1, "cp": 1},
        "batch": {"global_tokens": 2 * seq_len, "seq_len": seq_len, "micro_batch_size": 1},
        "tokenizer": {"type": "sentencepiece", "model": model, "bos": bos, "eos": True},
        "sources": [dict({"name": "s", "shuffle_window": 8, "workers": 2}, **source)],
    }


def segments(batch):
    cu = batch["cu_seqlens"].tolist()
    ids = batch["input_ids"][0].tolist()
    labels = batch["labels"][0].tolist()
    mask = batch["loss_mask"][0].tolist()
    for a, b in zip(cu, cu[1:]):
        yield ids[a:b], labels[a:b], mask[a:b]


def locate(docs: List[List[int]], seg: List[int]) -> Optional[Tuple[int, int]]:
    """(document, offset) where `seg` is a contiguous piece; None if that is ambiguous
    (a short piece of a cut document can occur in several)."""
    hits = [(d, o) for d, doc in enumerate(docs) for o in range(len(doc) - len(seg) + 1)
            if doc[o:o + len(seg)] == seg]
    assert hits, f"segment {seg[:8]}... is in no document"
    return hits[0] if len(hits) == 1 else None


def test_text_column_is_tokenized_with_bos_and_eos(tmp_path: Path, model: str):
    texts = sentences(40, 2)
    pq.write_table(pa.table({"text": texts}), tmp_path / "t.parquet", row_group_size=8)
    docs = [[1] + tokenize(model, t) + [2] for t in texts]
    loader = braid.Loader(config(model, {"path": str(tmp_path / "t.parquet"),
                                         "text_column": "text"}, bos=True),
                          rank=0, world_size=1)
    seen = 0
    for batch in itertools.islice(iter(loader), 6):
        for ids, labels, mask in segments(batch):
            hit = locate(docs, ids)
            if hit is None:
                continue
            d, o = hit
            seen += 1
            for k in range(len(ids)):
                if o + k + 1 < len(docs[d]):
                    assert labels[k] == docs[d][o + k + 1] and mask[k] == 1.0
    assert seen >= 6


def test_chat_loss_mask_is_one_only_on_response_targets(tmp_path: Path, model: str):
    prompts, responses = sentences(30, 3), sentences(30, 4)
    pq.write_table(pa.table({"prompt": prompts, "response": responses}),
                   tmp_path / "c.parquet", row_group_size=8)
    # The template of docs/sources.md: role header, content, EOS after the response.
    docs, targets = [], []
    for p, r in zip(prompts, responses):
        prompt = tokenize(model, "user:") + tokenize(model, p)
        header = tokenize(model, "assistant:")
        response = tokenize(model, r) + [2]
        docs.append(prompt + header + response)
        targets.append([0] * (len(prompt) + len(header)) + [1] * len(response))
    loader = braid.Loader(
        config(model, {"path": str(tmp_path / "c.parquet"),
                       "chat": {"prompt_column": "prompt", "response_column": "response"}}),
        rank=0, world_size=1)
    on_response = on_prompt = 0
    for batch in itertools.islice(iter(loader), 8):
        for ids, labels, mask in segments(batch):
            hit = locate(docs, ids)
            if hit is None:
                continue
            d, o = hit
            for k in range(len(ids)):
                t = o + k + 1  # the token that label k predicts
                if t < len(docs[d]):
                    assert labels[k] == docs[d][t]
                    assert mask[k] == float(targets[d][t]), (d, t)
                    on_response += targets[d][t]
                    on_prompt += 1 - targets[d][t]
                else:
                    assert mask[k] == 0.0
    assert on_response > 20 and on_prompt > 20


def test_messages_column_masks_assistant_turns(tmp_path: Path, model: str):
    s = sentences(12, 5)
    chats = [[{"role": "user", "content": s[2 * i]},
              {"role": "assistant", "content": s[2 * i + 1]}] for i in range(6)]
    pq.write_table(pa.table({"messages": chats}), tmp_path / "m.parquet")
    result = _core.read_source(
        _core.parse_config(json.dumps(
            config(model, {"path": str(tmp_path / "m.parquet"),
                           "chat": {"messages_column": "messages"}})), str(tmp_path)),
        0, 6)
    expected = sum(len(tokenize(model, c[1]["content"])) + 1 for c in chats)
    assert result["samples"] == 6 and result["skipped"] == 0
    assert result["loss_mask_ones"] == expected


def test_sharegpt_conversations_read_as_role_and_content(tmp_path: Path, model: str):
    """ShareGPT's messages ({from, value}; human, gpt, system), as many Hub chat sets and
    LLaVA hold them, give the batches of the same chats as {role, content} (user,
    assistant, system), in Parquet and in JSON Lines, where a file may mix both."""
    import gzip
    from conftest import assert_same_batches, take_batches

    s = sentences(40, 7)
    chats = [[{"role": "system", "content": s[3 * i]},
              {"role": "user", "content": s[3 * i + 1]},
              {"role": "assistant", "content": s[3 * i + 2]}] for i in range(12)]
    as_from = {"system": "system", "user": "human", "assistant": "gpt"}
    shared = [[{"from": as_from[m["role"]], "value": m["content"]} for m in c]
              for c in chats]
    pq.write_table(pa.table({"messages": chats}), tmp_path / "roles.parquet")
    (tmp_path / "sg").mkdir()
    pq.write_table(pa.table({"messages": shared}), tmp_path / "sg" / "share.parquet")
    mixed = [{"messages": shared[i] if i % 2 else chats[i], "id": i} for i in range(12)]
    (tmp_path / "mixed.jsonl.gz").write_bytes(
        gzip.compress("".join(json.dumps(r) + "\n" for r in mixed).encode()))

    def batches(path):
        cfg = config(model, {"path": str(path), "chat": {"messages_column": "messages"}},
                     seq_len=256)
        return take_batches([braid.Loader(cfg, rank=0, world_size=1)], 4)[0]

    want = batches(tmp_path / "roles.parquet")
    assert any(b["loss_mask"].sum() > 0 for b in want)
    assert_same_batches(batches(tmp_path / "sg" / "share.parquet"), want)
    assert_same_batches(batches(tmp_path / "mixed.jsonl.gz"), want)


def test_transform_config_errors(tmp_path: Path, model: str):
    pq.write_table(pa.table({"text": ["a b", None]}), tmp_path / "n.parquet")
    cfg = config(model, {"path": str(tmp_path / "n.parquet"), "text_column": "text"})
    del cfg["tokenizer"]
    with pytest.raises(ValueError, match="tokenizer"):
        braid.Loader(cfg, rank=0, world_size=1)
    cfg = config(model, {"path": str(tmp_path / "n.parquet"), "text_column": "text"})
    with pytest.raises(ValueError, match=r"n\.parquet.*row group 0.*row 1"):
        _core.read_source(_core.parse_config(json.dumps(cfg), str(tmp_path)),
                          0, 4)


def test_batches_are_the_same_for_any_worker_count(tmp_path: Path, model: str):
    pq.write_table(pa.table({"text": sentences(60, 6)}), tmp_path / "w.parquet",
                   row_group_size=8)
    streams = []
    for workers in (1, 3):
        cfg = config(model, {"path": str(tmp_path / "w.parquet"), "text_column": "text",
                             "workers": workers})
        batches = itertools.islice(iter(braid.Loader(cfg, rank=0, world_size=1)), 10)
        streams.append([(b["input_ids"].tolist(), b["loss_mask"].tolist()) for b in batches])
    assert len(streams[0]) == 10 and streams[0] == streams[1]
