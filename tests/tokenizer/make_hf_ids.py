#!/usr/bin/env python3
"""Record what HF transformers' GGUF tokenizer makes of a fixed corpus, for the tokenizer tests.

  .venv/bin/python tests/tokenizer/make_hf_ids.py --smollm2 PATH --gemma3 PATH --qwen2 PATH

Writes tests/tokenizer/data/hf_ids.json: for each model, the ids of every corpus text
(add_special_tokens=False; BOS/EOS are checked against the shared reference files instead).
The corpus is code, whitespace, numbers, many scripts, emoji, specials and seeded random text.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

OUT = Path(__file__).resolve().parent / "data" / "hf_ids.json"

FIXED = [
    "Hello world",
    " Hello  world\n\nNew paragraph\ttab",
    "In 2024, 1234567 people paid $3.50 each.",
    "naïve café — 日本語 🙂",
    "",
    " ",
    "  leading and trailing  ",
    "\n\n\n",
    "a\r\nb\rc\n",
    "\t\tindented\n    four spaces\n        eight",
    "I'm sure they'LL say it's WE'VE done what you'd've",
    "3.14159 1,000,000 0x1F 1e-9 ١٢٣ Ⅻ ½ 2²",
    "e\u0301 vs é, Ångström, Tiếng Việt, Ελληνικά, Русский, العربية, עברית",
    "हिन्दी भाषा, ภาษาไทย, 한국어 문장, 日本語の文章です。中文句子。",
    "👩‍💻 🇫🇷 👍🏽 🦜 🫨 ☃ 𝄞 𠀋",
    "def f(x):\n    return {'a': [1, 2, 3], \"b\": None}  # comment\n",
    "function add(a, b) { return a + b; }\nconsole.log(add(1, 2));",
    'fn main() {\n\tlet v: Vec<u8> = vec![0xff; 16];\n\tprintln!("{:?}", v);\n}',
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;",
    '{"key": "value", "list": [true, false, null], "n": -12.5e3}',
    '#!/bin/sh\nfor f in *.txt; do echo "$f" | wc -c; done 2>&1 >/dev/null',
    "<html><body><table><tr><td>cell</td></tr></table></body></html>",
    "**bold** _italic_ `code` ~~strike~~ > quote\n- item\n1. first",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n",
    "<|endoftext|><|endoftext|>text<|im_end|>",
    "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n",
    '<tool_call>{"name": "f"}</tool_call>',
    "<|fim_prefix|>def add(a, b):\n<|fim_suffix|>\n<|fim_middle|>",
    "<bos><eos><pad> <unk>",
    "<0x41> <0xFF> [PAD151665]",
    "x" * 40 + " " + "ab" * 30,
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "               many spaces               then text",
]

PIECES = [
    "the",
    " the",
    "ing",
    " and",
    "tion",
    "12",
    "345",
    "6789",
    ".",
    ",",
    "!",
    "?",
    "'s",
    "'t",
    " ",
    "  ",
    "   ",
    "\t",
    "\n",
    "\n\n",
    "\r\n",
    "é",
    "ü",
    "ß",
    "ñ",
    "日本",
    "語",
    "中文",
    "한",
    "ไทย",
    "ह",
    "🙂",
    "🦜",
    "👍🏽",
    "e\u0301",
    "—",
    "…",
    "“",
    "”",
    "(",
    ")",
    "{",
    "}",
    "<",
    ">",
    "<|im_end|>",
    "<end_of_turn>",
    "_",
    "-",
    "==",
    "=>",
    "::",
    "0",
    "9",
    "Ⅻ",
    "١",
    "\u00a0",
    "\u200b",
    "A",
    "Z",
    "Hello",
    "WORLD",
    "café",
    "x",
    "yz",
    "'LL",
    "\u3000",
]


def corpus() -> list[str]:
    rng = random.Random(1234)
    texts = list(FIXED)
    for _ in range(300):
        texts.append("".join(rng.choice(PIECES) for _ in range(rng.randint(1, 14))))
    for _ in range(100):  # random code points from the BMP and the emoji planes
        chars = [
            chr(
                rng.choice(
                    [
                        rng.randint(0x20, 0x2FF),
                        rng.randint(0x3000, 0x9FFF),
                        rng.randint(0x1F300, 0x1FAFF),
                    ]
                )
            )
            for _ in range(rng.randint(1, 8))
        ]
        texts.append("".join(c for c in chars if not 0xD800 <= ord(c) <= 0xDFFF))
    return texts


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for key in ("smollm2", "gemma3", "qwen2"):
        parser.add_argument(f"--{key}", type=Path, required=True)
    args = parser.parse_args()

    import tokenizers
    import transformers
    from transformers import AutoTokenizer

    texts = corpus()
    doc: dict = {
        "made_by": "tests/tokenizer/make_hf_ids.py",
        "versions": {
            "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__,
        },
        "models": {},
    }
    for key in ("smollm2", "gemma3", "qwen2"):
        path: Path = getattr(args, key)
        start = time.time()
        tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        cases = [{"text": t, "ids": tok(t, add_special_tokens=False)["input_ids"]} for t in texts]
        doc["models"][key] = {
            "gguf_sha256": sha256(path),
            "hf_tokenizer_class": type(tok).__name__,
            "cases": cases,
        }
        print(f"{key}: {len(cases)} texts in {time.time() - start:.1f}s", flush=True)
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(json.dumps(doc, ensure_ascii=False, indent=None) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
