"""The real models' tokenizers for the tests: built from the GGUF metadata, with build times."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ember.gguf.reader import GGUFFile
from ember.tokenizer import Tokenizer

REFERENCE_KEYS = {
    "smollm2": "smollm2-135m-instruct-q4_1",
    "gemma3": "gemma-3-270m-q4_k_m",
    "qwen2": "qwen2.5-coder-0.5b-instruct-q4_k_m",
}


@dataclass(frozen=True, slots=True)
class Built:
    name: str
    tokenizer: Tokenizer
    metadata: dict[str, Any]
    build_seconds: float  # wall clock
    build_cpu_seconds: float


def build(name: str, path: Path) -> Built:
    with GGUFFile.open(path) as gguf:
        metadata = dict(gguf.metadata)
    wall, cpu = time.perf_counter(), time.process_time()
    tokenizer = Tokenizer.from_metadata(metadata)
    return Built(name, tokenizer, metadata, time.perf_counter() - wall, time.process_time() - cpu)
