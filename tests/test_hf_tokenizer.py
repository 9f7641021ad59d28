"""Hugging Face tokenizers (`tokenizer: {type: huggingface, file: tokenizer.json}`).

The tokenizers are trained here with the `tokenizers` library itself (byte-level BPE with
a regex pre-tokenizer, special and added tokens, a template post-processor): no download.
Every row's ids must equal `Tokenizer.from_file(...).encode(text).ids`.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Dict, List

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from braid import _core

from conftest import (assert_resumes_batch_for_batch, braid_cli, start_ranks,
                      write_config)

# An optional dependency of braid (braid[hf]); requirements-dev.txt pins it.
from tokenizers import (Regex, Tokenizer, decoders, models, pre_tokenizers, processors,
                        trainers)

# A GPT-style split: contractions, letters, numbers, punctuation, spaces.
SPLIT = (r"'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}{1,3}| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+")
SPECIALS = ["<|begin|>", "<|end|>", "<|pad|>"]
ADDED = "<tool>"  # an added (non-special) token

WORDS = ("the data loader reads parquet files and mixes many sources into steps of tokens "
         "Straße über größer naïve café 東京 データ ローダー 数据 加载 🙂 🚀 ω≈π "
         "it's we'll 2024 3.14159 #include <vector> x=y+1;").split()


def sentences(n: int, seed: int, lo: int = 3, hi: int = 30) -> List[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))
            for _ in range(n)]


def train(path: Path, post: str = "template") -> str:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(sentences(2000, 1), trainer)
    tok.add_tokens([ADDED])
    if post == "template":
        tok.post_processor = processors.Sequence([
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(
                single="<|begin|> $A <|end|>",
                special_tokens=[(s, tok.token_to_id(s)) for s in SPECIALS[:2]]),
        ])
    else:  # byte-level only: no special tokens around a text
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.save(str(path))
    return str(path)


@pytest.fixture(scope="module")
def tok_file(tmp_path_factory) -> str:
    return train(tmp_path_factory.mktemp("hf") / "tokenizer.json")


def texts_for_test() -> List[str]:
    texts = sentences(150, 2)
    rng = random.Random(5)
    texts[3] = " ".join(sentences(4000, 6))  # very long (~100k characters)
    texts[7] = "   leading spaces and trailing   "
    texts[9] = "specials inline <|end|> and <|begin|> and " + ADDED + " mid-text"
    texts[11] = "".join(chr(rng.randint(0x4E00, 0x9FFF)) for _ in range(3000))  # CJK
    texts[12] = "😀🙃" * 500 + "\n\n\tline\r\nbreaks"
    texts[13] = "\u0000nul and \u200bzero-width and combining e\u0301"
    return texts


def config(path: str, tok: Dict, source: Dict, workers: int = 1) -> "_core.Config":
    c = {
        "seed": 7,
        "batch": {"global_tokens": 4096, "seq_len": 4096},
        "tokenizer": tok,
        "sources": [dict({"name": "s", "path": path, "shuffle_window": 32,
                          "workers": workers, "on_error": "skip"}, **source)],
    }
    return _core.parse_config(json.dumps(c), "/")


def write_texts(path: Path, texts: List[str], row_group_size: int = 16) -> str:
    pq.write_table(pa.table({"text": texts}), path, row_group_size=row_group_size)
    return str(path)


def test_every_row_equals_encode(tmp_path: Path, tok_file: str):
    texts = texts_for_test()
    path = write_texts(tmp_path / "t.parquet", texts)
    ref = Tokenizer.from_file(tok_file)
    got = _core.source_samples(
        config(path, {"type": "huggingface", "file": tok_file}, {"text_column": "text"}),
        0, len(texts))
    assert sorted(s["row"] for s in got) == list(range(len(texts)))
    begin, end = ref.token_to_id("<|begin|>"), ref.token_to_id("<|end|>")
    for s in got:
        expected = ref.encode(texts[s["row"]]).ids
        assert s["ids"] == expected, s["row"]
        assert s["tokens"] == len(expected) and s["loss_mask"] == []
        assert expected[0] == begin and expected[-1] == end  # the post-processor's
    # The added and special tokens in the text are single ids, as the library makes them.
    row9 = next(s for s in got if s["row"] == 9)["ids"]
    assert ref.token_to_id(ADDED) in row9 and row9.count(end) == 2
    assert len(next(s for s in got if s["row"] == 3)["ids"]) > 10_000


def test_add_special_tokens_false_and_eos_token(tmp_path: Path, tok_file: str):
    texts = sentences(40, 3)
    path = write_texts(tmp_path / "t.parquet", texts)
    ref = Tokenizer.from_file(tok_file)
    pad = ref.token_to_id("<|pad|>")
    plain = _core.source_samples(
        config(path, {"type": "huggingface", "file": tok_file, "add_special_tokens": False},
               {"text_column": "text"}), 0, 40)
    for s in plain:
        assert s["ids"] == ref.encode(texts[s["row"]], add_special_tokens=False).ids
    extra = _core.source_samples(
        config(path, {"type": "huggingface", "file": tok_file, "eos_token": "<|pad|>",
                      "bos_token": "<|end|>"}, {"text_column": "text"}), 0, 40)
    for s in extra:
        assert s["ids"] == [ref.token_to_id("<|end|>")] + ref.encode(texts[s["row"]]).ids + [pad]


def test_same_stream_for_workers_1_and_2_and_per_source_tokenizer(tmp_path: Path,
                                                                   tok_file: str):
    texts = sentences(300, 4) + texts_for_test()
    texts[20] = None
    texts[21] = ""
    path = write_texts(tmp_path / "t.parquet", texts, row_group_size=50)
    sp_model = _core.train_tiny_sentencepiece(sentences(200, 8), str(tmp_path / "sp"), 150)
    hf = {"type": "huggingface", "file": tok_file}
    n = 2 * len(texts) + 17  # over an epoch boundary

    # The root tokenizer is SentencePiece; the source has its own Hugging Face one.
    def samples(workers: int):
        c = config(path, {"type": "sentencepiece", "model": sp_model},
                   {"text_column": "text", "tokenizer": hf}, workers)
        return _core.source_samples(c, 0, n)

    one, two = samples(1), samples(2)
    assert one == two
    ref = Tokenizer.from_file(tok_file)
    skipped = {s["row"] for s in one if s["skip"] != 0}
    assert skipped == {20, 21}
    for s in one:
        if s["skip"] == 0:
            assert s["ids"] == ref.encode(texts[s["row"]]).ids


def test_chat_frames_turns_with_the_post_processor(tmp_path: Path, tok_file: str):
    prompts, responses = sentences(30, 5), sentences(30, 6)
    pq.write_table(pa.table({"prompt": prompts, "response": responses}),
                   tmp_path / "c.parquet", row_group_size=8)
    ref = Tokenizer.from_file(tok_file)
    begin, end = ref.token_to_id("<|begin|>"), ref.token_to_id("<|end|>")

    def plain(text: str) -> List[int]:
        return ref.encode(text, add_special_tokens=False).ids

    got = _core.source_samples(
        config(str(tmp_path / "c.parquet"), {"type": "huggingface", "file": tok_file},
               {"chat": {"prompt_column": "prompt", "response_column": "response"}},
               workers=2), 0, 30)
    assert len(got) == 30
    for s in got:
        p, r = prompts[s["row"]], responses[s["row"]]
        head = [begin] + plain("user:") + plain(p) + plain("assistant:")
        tail = plain(r) + [end]
        assert s["ids"] == head + tail
        assert s["loss_mask"] == [0] * len(head) + [1] * len(tail)


def test_encode_batch_releases_the_gil(tok_file: str):
    """While one thread is inside encode_batch, another runs Python; inside a single
    encode() it cannot (the control). With a switch interval of 100 s the GIL changes
    hands only when a thread gives it up, so the count is exact, not a timing."""
    tok = Tokenizer.from_file(tok_file)
    batch = sentences(3000, 9, 20, 60)
    counter = [0]
    done = threading.Event()

    def spin():
        while not done.is_set():
            counter[0] += 1
            time.sleep(0)  # gives up the GIL, then waits for it

    old = sys.getswitchinterval()
    sys.setswitchinterval(100.0)
    worker = threading.Thread(target=spin, daemon=True)
    try:
        worker.start()
        c0 = counter[0]
        for text in batch[:300]:
            tok.encode(text)
        during_encode = counter[0] - c0
        c0 = counter[0]
        tok.encode_batch(batch)
        during_batch = counter[0] - c0
        c0 = counter[0]
        tok.encode_batch_fast(batch)
        during_fast = counter[0] - c0
    finally:
        done.set()
        sys.setswitchinterval(old)
        worker.join(timeout=60)
    assert not worker.is_alive()
    assert during_encode == 0
    assert during_batch > 0 and during_fast > 0


LOADER_SCRIPT = textwrap.dedent("""
    import itertools, json, sys
    import braid
    from tokenizers import Tokenizer
    cfg, tok_file = json.loads(sys.argv[1]), sys.argv[2]
    with open(sys.argv[3]) as f:
        texts = json.load(f)
    ref = Tokenizer.from_file(tok_file)
    docs = [ref.encode(t).ids for t in texts]
    loader = braid.Loader(cfg, rank=0, world_size=1)
    found = 0
    for batch in itertools.islice(iter(loader), 4):
        ids = batch["input_ids"][0].tolist()
        cu = batch["cu_seqlens"].tolist()
        for a, b in zip(cu, cu[1:]):
            seg = ids[a:b]
            found += any(d[:len(seg)] == seg for d in docs if len(seg) >= 4)
    print("FOUND", found)
    # Exits with the loader's threads still running: no hang, no crash.
""")


def test_loader_in_a_fresh_process(tmp_path: Path, tok_file: str):
    texts = sentences(200, 10)
    path = write_texts(tmp_path / "t.parquet", texts)
    cfg = {
        "seed": 1,
        "topology": {"dp": 1, "tp": 1, "pp": 1, "cp": 1},
        "batch": {"global_tokens": 256, "seq_len": 128, "micro_batch_size": 1},
        "tokenizer": {"type": "huggingface", "file": tok_file},
        "sources": [{"name": "s", "path": path, "text_column": "text", "workers": 2}],
    }
    (tmp_path / "texts.json").write_text(json.dumps(texts))
    result = subprocess.run(
        [sys.executable, "-c", LOADER_SCRIPT, json.dumps(cfg), tok_file,
         str(tmp_path / "texts.json")],
        capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    found = int(result.stdout.split("FOUND")[1])
    assert found >= 4, result.stdout


def cli_config(tmp_path: Path, tok: Dict) -> Path:
    path = write_texts(tmp_path / "t.parquet", sentences(20, 11))
    return write_config(tmp_path / "c.json", {
        "seed": 1,
        "batch": {"global_tokens": 256, "seq_len": 128},
        "sources": [{"name": "s", "path": path, "text_column": "text", "tokenizer": tok}],
    })


@pytest.mark.parametrize("case", ["missing", "invalid", "bad_token"])
def test_config_errors_exit_2_naming_the_key(tmp_path: Path, tok_file: str, case: str):
    tok = {"type": "huggingface", "file": str(tmp_path / "nope.json")}
    key = "sources[0].tokenizer.file"
    if case == "invalid":
        (tmp_path / "bad.json").write_text('{"version": "1.0", "model": 7}')
        tok["file"] = str(tmp_path / "bad.json")
    elif case == "bad_token":
        tok = {"type": "huggingface", "file": tok_file, "eos_token": "<|nope|>"}
        key = "sources[0].tokenizer.eos_token"
    result = braid_cli("plan", cli_config(tmp_path, tok), "--steps", "1")
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert key in result.stderr, result.stderr


def test_missing_tokenizers_package_is_a_config_error(tmp_path: Path, tok_file: str):
    """Without the `tokenizers` package (import blocked), braid imports fine and a
    huggingface tokenizer is a config error naming the key."""
    cfg = cli_config(tmp_path, {"type": "huggingface", "file": tok_file})
    script = textwrap.dedent("""
        import sys
        sys.modules["tokenizers"] = None  # import tokenizers raises ImportError
        import braid.cli
        sys.exit(braid.cli.main(sys.argv[1:]))
    """)
    result = subprocess.run([sys.executable, "-c", script, "plan", str(cfg), "--steps", "1"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "sources[0].tokenizer.type" in result.stderr
    assert "tokenizers" in result.stderr


CHATML = ("{% for m in messages %}"
          "{% if m['role'] == 'tool' %}{{ raise_exception('no tool turns here') }}{% endif %}"
          "<|begin|>{{ m['role'] }}\n{{ m['content'] }}<|end|>\n"
          "{% endfor %}"
          "{% if add_generation_prompt %}<|begin|>assistant\n{% endif %}")


def chat_rows(n: int, seed: int) -> List[List[Dict[str, str]]]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        turns = [{"role": "system", "content": "be brief, ça va? 東京"}]
        for _ in range(rng.randint(1, 3)):
            turns.append({"role": "user", "content": sentences(1, rng.randrange(999))[0]})
            turns.append({"role": "assistant",
                          "content": sentences(1, rng.randrange(999))[0]})
        rows.append(turns)
    return rows


def test_chat_uses_the_tokenizers_own_template(tmp_path: Path):
    """With a chat_template in tokenizer_config.json beside tokenizer.json, a chat's ids
    are the rendered conversation encoded without special tokens (what
    `apply_chat_template(tokenize=True)` gives), and the loss mask covers exactly what
    each assistant message made: its content and end-of-turn markup, not the header."""
    folder = tmp_path / "tok"
    folder.mkdir()
    tok_file = train(folder / "tokenizer.json")
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": CHATML, "bos_token": "<|begin|>", "eos_token": "<|end|>"}))
    rows = chat_rows(40, 3)
    rows[5].append({"role": "tool", "content": "refused by the template"})
    struct = pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))
    pq.write_table(pa.table({"messages": pa.array(rows, struct)}), tmp_path / "c.parquet",
                   row_group_size=8)
    ref = Tokenizer.from_file(tok_file)
    source = {"chat": {"messages_column": "messages"}}
    got = _core.source_samples(
        config(str(tmp_path / "c.parquet"), {"type": "huggingface", "file": tok_file},
               source, workers=2), 0, 40)
    # The chat the template refused (raise_exception) follows on_error: a counted skip.
    assert sorted(s["row"] for s in got if s["skip"] != 0) == [5]
    got = [s for s in got if s["skip"] == 0]
    assert len(got) == 39
    for s in got:
        text, spans = "", []
        for m in rows[s["row"]]:
            text += f"<|begin|>{m['role']}\n"
            begin = len(text)
            text += m["content"] + "<|end|>\n"
            if m["role"] == "assistant":
                spans.append((begin, len(text)))
        want = ref.encode(text, add_special_tokens=False)
        assert s["ids"] == want.ids
        mask = [int(any(b <= start < e for b, e in spans)) for start, _ in want.offsets]
        assert s["loss_mask"] == mask
        assert 0 < sum(mask) < len(mask)
    # `chat_template: plain` keeps Braid's plain template (role headers "user:", ...).
    plain = _core.source_samples(
        config(str(tmp_path / "c.parquet"),
               {"type": "huggingface", "file": tok_file, "chat_template": "plain"},
               source), 0, 3)
    header = ref.encode("system:", add_special_tokens=False).ids
    for s in plain:
        assert s["ids"][1:1 + len(header)] == header
    # on_error: fail stops at the refused chat, naming its file and row.
    failing = config(str(tmp_path / "c.parquet"), {"type": "huggingface", "file": tok_file},
                     dict(source, on_error="fail"))
    with pytest.raises(_core.DataError, match=r"row 5\).*no tool turns here"):
        _core.source_samples(failing, 0, 40)


def test_plan_with_a_length_cache_reads_what_the_first_plan_kept(tmp_path: Path,
                                                                 tok_file: str):
    # `braid plan` as a user runs it, twice: the first encodes every row it counts and
    # keeps the counts (one entry per row group); the second finds every entry and
    # writes none, with the same plan; another tokenizer option is another key.
    path = write_texts(tmp_path / "t.parquet", texts_for_test())  # 150 rows, groups of 16
    def job(name: str, tok: Dict, cache: bool = True) -> Path:
        cfg = {"seed": 3, "batch": {"global_tokens": 4096, "seq_len": 1024},
               "tokenizer": tok,
               "sources": [{"name": "s", "path": path, "text_column": "text",
                            "workers": 2}]}
        if cache:
            cfg["runtime"] = {"length_cache": "lens"}  # beside the config
        return write_config(tmp_path / name, cfg)

    def entries() -> Dict[str, int]:
        folder = tmp_path / "lens"
        return {p.name: p.stat().st_mtime_ns for p in folder.glob("*.lens")}

    tok = {"type": "huggingface", "file": tok_file}
    first = braid_cli("plan", job("c.json", tok), "--steps", "12")
    assert first.returncode == 0, first.stderr
    kept = entries()
    assert len(kept) == 10, kept
    second = braid_cli("plan", job("c.json", tok), "--steps", "12")
    assert second.returncode == 0, second.stderr
    assert second.stdout == first.stdout
    assert entries() == kept  # every entry read, none written again
    uncached = braid_cli("plan", job("plain.json", tok, cache=False), "--steps", "12")
    assert uncached.stdout == first.stdout
    other = braid_cli("plan", job("c.json", dict(tok, add_special_tokens=False)),
                      "--steps", "12")
    assert other.returncode == 0, other.stderr
    assert other.stdout != first.stdout
    assert len(entries()) == 20


def test_a_nodes_ranks_share_the_counts_and_build_the_same_batches(tmp_path: Path,
                                                                   tok_file: str):
    # Four trainer processes started at once, as torchrun starts them on a node, each a
    # fresh `braid.Loader` of one rank. With runtime.length_cache they count each row
    # group once between them (under its lock) and encode the rows they build when
    # their step is planned: the same bytes as without the cache, fresh or kept.
    path = write_texts(tmp_path / "t.parquet", texts_for_test())  # 150 rows, groups of 16
    job = {"seed": 3, "topology": {"dp": 4},
           "batch": {"global_tokens": 4096, "seq_len": 1024},
           "tokenizer": {"type": "huggingface", "file": tok_file},
           "sources": [{"name": "s", "path": path, "text_column": "text", "workers": 2}]}
    plain = write_config(tmp_path / "plain.json", job)
    shared = write_config(tmp_path / "shared.json",
                          dict(job, runtime={"length_cache": str(tmp_path / "lens")}))

    notices = []  # per run, the ranks that said the source is tokenized in every rank

    def node(config: Path) -> List[List[str]]:
        ranks = start_ranks(config, world=4, n=10)
        notices.append([r for r, out in enumerate(ranks)
                        if "set runtime.length_cache" in out["stderr"]])
        return [out["digests"] for out in ranks]

    want = node(plain)
    assert len({d for rank in want for d in rank}) == 40  # 40 distinct micro-batches
    assert notices == [[0]]  # rank 0 says what the cache would save; once, not per rank
    assert node(shared) == want
    assert notices[-1] == []
    entries = {p.name for p in (tmp_path / "lens").glob("*.lens")}
    assert len(entries) == 10, entries  # every row group, each written by its counter
    locks = {p.name for p in (tmp_path / "lens").glob("*.lens.lock")}
    assert {e + ".lock" for e in entries} <= locks
    assert node(shared) == want  # every count kept: the ranks encode only their rows
    # A rank resumes inside the stream as without the cache.
    assert_resumes_batch_for_batch(json.loads(shared.read_text()), n=8, split=3, rank=2,
                                   world_size=4)
