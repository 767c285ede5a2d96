#!/usr/bin/env python3
"""Write the Hugging Face tokenizer files of the shipped byte-level models (``smile_llm/models/default``,
``default_hybrid`` and ``default_draft``): ``tokenizer.json``, ``tokenizer_config.json`` and ``chat_template.jinja``.

``tokenizer.json`` is the package's byte tokenizer (``smile_llm.text.tokenizer.ByteTokenizer``) in the
``tokenizers`` library's format, so that ``transformers.AutoTokenizer`` and every tool built on it tokenize these
models exactly as the package does:

- a BPE model without merges whose vocabulary maps the byte-level alphabet character of byte ``b`` (GPT-2's
  ``bytes_to_unicode``, ``pre_tokenizers.ByteLevel.alphabet()``) to id ``b``, so every byte is one token;
- a ByteLevel pre-tokenizer without prefix space and without regex splitting, and a ByteLevel decoder;
- ``<|endoftext|>`` as the one added (special) token, id 256, the models' bos and eos.

``tokenizer_config.json`` names ``PreTrainedTokenizerFast``, the special tokens, ``model_max_length`` (the folder's
``max_position_embeddings``), ``clean_up_tokenization_spaces: false`` (decoding gives the bytes back unchanged) and
``split_special_tokens: true``: ``AutoTokenizer`` then encodes the text ``<|endoftext|>`` as its 13 bytes, as the
byte tokenizer does, so a prompt cannot forge the end-of-text id. (The ``tokenizers`` library alone, which does not
read ``tokenizer_config.json``, maps that text to id 256.)

``chat_template.jinja`` is a ChatML template: ``<|im_start|>{role}\\n{content}<|im_end|>\\n`` per message and
``<|im_start|>assistant\\n`` as the generation prompt; tools are listed in a system block, one JSON object a line
within ``<tools></tools>``, and calls are asked for as ``<tool_call>\\n{"name": ..., "arguments": ...}\\n
</tool_call>``. ``<|im_start|>`` and ``<|im_end|>`` are plain text for these models (their bytes), not tokens.

The package itself keeps using its byte tokenizer for these folders (``smile_tokenizer.json`` takes precedence over
``tokenizer.json``). The output is deterministic; ``tests/models/test_shipped_tokenizer.py`` checks that the shipped
files are what this script writes.

Example::

    python scripts/make_byte_tokenizer.py            # rewrite the three folders' files
    python scripts/make_byte_tokenizer.py --check    # exit 1 if a file differs from what would be written
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FOLDERS = tuple(REPO / "smile_llm" / "models" / name for name in ("default", "default_hybrid", "default_draft"))
EOS_TEXT = "<|endoftext|>"
EOS_ID = 256

CHAT_TEMPLATE = """\
{#- ChatML. Tools: listed in a system block (one JSON object a line); calls answered in <tool_call> blocks. -#}
{%- macro text(content) -%}
    {%- if content is string -%}
        {{- content -}}
    {%- elif content is iterable -%}
        {%- for part in content if part.type == 'text' -%}
            {{- part.text -}}
        {%- endfor -%}
    {%- endif -%}
{%- endmacro -%}
{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0].role == 'system' %}
        {{- text(messages[0].content) + '\\n\\n' }}
    {%- endif %}
    {{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n' }}
    {{- 'You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}
    {%- for tool in tools %}
        {{- '\\n' }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within ' }}
    {{- '<tool_call></tool_call> XML tags:\\n<tool_call>\\n' }}
    {{- '{"name": <function-name>, "arguments": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == 'system' and loop.first and tools %}
    {%- elif message.role == 'assistant' and message.tool_calls %}
        {{- '<|im_start|>assistant' }}
        {%- if message.content %}
            {{- '\\n' + text(message.content) }}
        {%- endif %}
        {%- for call in message.tool_calls %}
            {%- if call.function is defined %}
                {%- set call = call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": ' + (call.name | tojson) + ', "arguments": ' }}
            {%- if call.arguments is string %}
                {{- call.arguments }}
            {%- else %}
                {{- call.arguments | tojson }}
            {%- endif %}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == 'tool' %}
        {%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' + text(message.content) + '\\n</tool_response>' }}
        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- else %}
        {{- '<|im_start|>' + message.role + '\\n' + text(message.content) + '<|im_end|>\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""


def byte_alphabet() -> dict[int, str]:
    """GPT-2's ``bytes_to_unicode``: byte -> the printable character the ByteLevel pre-tokenizer maps it to."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = {b: chr(b) for b in printable}
    shifted = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + shifted)
            shifted += 1
    return dict(sorted(chars.items()))


def tokenizer_json() -> str:
    """The byte tokenizer as ``tokenizer.json`` text."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    alphabet = byte_alphabet()
    if sorted(alphabet.values()) != sorted(pre_tokenizers.ByteLevel.alphabet()):
        raise SystemExit("the tokenizers library's byte-level alphabet is not GPT-2's bytes_to_unicode")
    tok = Tokenizer(models.BPE(vocab={char: b for b, char in alphabet.items()}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(EOS_TEXT, special=True, normalized=False)])
    if tok.token_to_id(EOS_TEXT) != EOS_ID or tok.get_vocab_size() != EOS_ID + 1:
        raise SystemExit(f"{EOS_TEXT} did not get id {EOS_ID}")
    return json.dumps(json.loads(tok.to_str()), indent=2, ensure_ascii=False) + "\n"


def tokenizer_config(folder: Path) -> str:
    """``tokenizer_config.json`` text for ``folder`` (its ``config.json`` gives ``model_max_length``)."""
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    spec = json.loads((folder / "smile_tokenizer.json").read_text(encoding="utf-8"))
    if (spec.get("vocab_size"), spec.get("eos_token_id"), config.get("vocab_size")) != (257, EOS_ID, 257):
        raise SystemExit(f"{folder} is not a byte-level model with {EOS_TEXT} as id {EOS_ID}")
    out = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": EOS_TEXT,
        "eos_token": EOS_TEXT,
        "pad_token": EOS_TEXT,
        "model_max_length": config["max_position_embeddings"],
        "clean_up_tokenization_spaces": False,
        "split_special_tokens": True,
    }
    return json.dumps(out, indent=2) + "\n"


def files(folder: Path) -> dict[str, str]:
    """File name -> text of what this script writes into ``folder``."""
    return {"tokenizer.json": tokenizer_json(), "tokenizer_config.json": tokenizer_config(folder),
            "chat_template.jinja": CHAT_TEMPLATE}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="report files that differ; write nothing")
    args = parser.parse_args(argv)
    stale = []
    for folder in FOLDERS:
        for name, text in files(folder).items():
            path = folder / name
            if args.check:
                if not path.is_file() or path.read_text(encoding="utf-8") != text:
                    stale.append(str(path.relative_to(REPO)))
            else:
                path.write_text(text, encoding="utf-8")
                print(f"wrote {path.relative_to(REPO)}")
    for path in stale:
        print(f"differs: {path}", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
