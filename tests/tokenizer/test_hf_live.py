"""Qwen2.5-Coder against HF transformers' GGUF tokenizer, live: random text and the stored corpus.

Slow (transformers takes ~20 s to build this tokenizer); the stored ids in data/hf_ids.json give
the same check quickly in test_real_vocabularies.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizer_models import Built

pytestmark = [pytest.mark.model, pytest.mark.slow]

HF_IDS = Path(__file__).parent / "data" / "hf_ids.json"
CODE = "\n".join(
    [
        "import numpy as np\n\n\nclass Foo(Base):\n    def __init__(self, x: int = 0) -> None:",
        "        self.x = x  # TODO: check\n        print(f'{self.x!r:>10}')\n",
        "for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }",
        "<|im_start|>user\nWrite `quicksort` in Rust<|im_end|>\n<|im_start|>assistant\n",
    ]
)


@pytest.fixture(scope="module")
def hf_qwen(qwen2_path: Path) -> Any:
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(
        str(qwen2_path.parent), gguf_file=qwen2_path.name
    )


def test_stored_corpus_is_what_hf_says(hf_qwen: Any, qwen2: Built) -> None:
    cases = json.loads(HF_IDS.read_text())["models"]["qwen2"]["cases"]
    for case in [*cases, {"text": CODE, "ids": None}]:
        expected = hf_qwen(case["text"], add_special_tokens=False)["input_ids"]
        assert case["ids"] in (None, expected)
        assert qwen2.tokenizer.encode(case["text"], add_special=False) == expected


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.text(st.characters(exclude_categories=("Cs",)), max_size=80))
def test_random_text_matches_hf(hf_qwen: Any, qwen2: Built, text: str) -> None:
    expected = hf_qwen(text, add_special_tokens=True)["input_ids"]
    assert qwen2.tokenizer.encode(text) == expected
