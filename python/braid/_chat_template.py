"""A Hugging Face tokenizer's own chat template (``tokenizer_config.json``), for chat
sources under ``tokenizer: {type: huggingface}`` (docs/sources.md, "Chat template").

The extension calls ``load`` once per tokenizer and ``encode`` per batch of chats; the
core turns the returned character ranges into the loss mask. Only the Jinja rendering is
here (the core links no Jinja): Jinja2 in a sandbox, as ``transformers`` renders chat
templates (``trim_blocks``, ``lstrip_blocks``, ``raise_exception``, ``tojson``), with no
clock (``strftime_now`` is not offered: the stream must not depend on the date).
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

Span = Tuple[int, int]


class ChatTemplate:
    """The template of one tokenizer, with its ``bos_token`` / ``eos_token`` strings."""

    def __init__(self, source: str, bos_token: str, eos_token: str, path: str) -> None:
        try:
            import jinja2
            from jinja2.sandbox import ImmutableSandboxedEnvironment
        except ImportError as exc:
            raise RuntimeError(f"{path} has a chat_template, which needs the jinja2 package "
                               "(pip install 'braid[hf]'), or set "
                               "tokenizer.chat_template: plain") from exc

        def raise_exception(message: str) -> None:
            raise jinja2.exceptions.TemplateError(message)

        def tojson(value: Any, indent: Optional[int] = None, separators=None,
                   sort_keys: bool = False, ensure_ascii: bool = False) -> str:
            return json.dumps(value, indent=indent, separators=separators,
                              sort_keys=sort_keys, ensure_ascii=ensure_ascii)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=["jinja2.ext.loopcontrols"])
        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception
        self._template = env.from_string(source)
        self._bos, self._eos = bos_token, eos_token

    def render(self, messages: List[Dict[str, str]], generation_prompt: bool) -> str:
        return self._template.render(messages=messages, bos_token=self._bos,
                                     eos_token=self._eos,
                                     add_generation_prompt=generation_prompt)

    def render_with_spans(self, messages: List[Dict[str, str]]) -> Tuple[str, List[Span]]:
        """The chat's text and, per assistant message, the [begin, end) range of the text
        it made: from the end of the conversation before it with the generation prompt
        (so the prompt's markup is not trained) to the end of the conversation through
        it (its content and end-of-turn markup)."""
        text = self.render(messages, False)
        spans = []
        for k, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            before = self.render(messages[:k], True) if k else ""
            through = self.render(messages[:k + 1], False)
            if not (through.startswith(before) and text.startswith(through)):
                raise ValueError(
                    f"the template does not render the chat through message {k} as a "
                    "prefix of the whole chat, so the assistant's tokens cannot be told "
                    "apart; set tokenizer.chat_template: plain")
            spans.append((len(before), len(through)))
        return text, spans


def load(tokenizer_file: str) -> Optional[ChatTemplate]:
    """The chat template of the tokenizer_config.json beside ``tokenizer_file``, or None
    when there is none (no file, or no ``chat_template`` in it)."""
    path = os.path.join(os.path.dirname(os.path.abspath(tokenizer_file)),
                        "tokenizer_config.json")
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        config = json.load(f)
    source = config.get("chat_template")
    if isinstance(source, list):  # named templates: the default one
        source = next((t.get("template") for t in source if t.get("name") == "default"),
                      None)
    if not source:
        return None

    def token(value: Any) -> str:  # "<s>" or {"content": "<s>", ...}
        if isinstance(value, dict):
            return value.get("content") or ""
        return value or ""

    return ChatTemplate(source, token(config.get("bos_token")),
                        token(config.get("eos_token")), path)


def encode(template: ChatTemplate, tokenizer: Any,
           chats: Sequence[Sequence[Tuple[str, str]]]
           ) -> List[Union[Tuple[List[int], List[int], List[Span]], str]]:
    """Per chat of (role, content) pairs: its ids (the rendered text encoded without
    special tokens, one ``encode_batch`` call for the batch), each token's start in the
    text, and the assistant messages' ranges; or, for a chat the template refuses (its
    ``raise_exception``, or one it does not render as prefixes), why: bad data, which
    the core handles like a null (``on_error``)."""
    import jinja2

    out: List[Any] = []
    texts, where = [], []
    for chat in chats:
        try:
            text, ranges = template.render_with_spans(
                [{"role": role, "content": content} for role, content in chat])
        except (jinja2.exceptions.TemplateError, ValueError) as exc:
            out.append(f"{type(exc).__name__}: {exc}")
            continue
        where.append(len(out))
        out.append(ranges)
        texts.append(text)
    encodings = tokenizer.encode_batch(texts, add_special_tokens=False) if texts else []
    for k, e in zip(where, encodings):
        out[k] = (e.ids, [start for start, _ in e.offsets], out[k])
    return out
