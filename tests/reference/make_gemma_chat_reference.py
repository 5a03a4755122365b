#!/usr/bin/env python3
"""Add longer Gemma 3 chat prompts to tests/reference/gemma-3-270m-q4_k_m.reference.json with
HF transformers, as make_reference.py made the file's others.

The shared reference's chat prompt is 15 tokens: a prompt of up to 16 rows takes the decode
kernels, so it never met a prompt's own products (gemm16, and gemm8's int8 gate and up until
2026-12-06, which left this 26-token chat 5.8% of the largest first logit off the reference).
It loads /work/shared/reference/make_reference.py by path (make_qwen_reference.load_shared) and
reuses its `run_prompt`, so the added entries have the others' structure.

  PYTHONPATH=/tmp/site HF_HUB_OFFLINE=1 .venv/bin/python \
      tests/reference/make_gemma_chat_reference.py --gguf ~/.ember/cache/gemma-3-270m-q4_k_m.gguf

transformers needs `accelerate` to load a GGUF (not in Ember's venv: `pip install --no-deps
--target /tmp/site accelerate`). The GGUF's sha256 is checked first.
"""

import argparse
import json
import os
import sys
from pathlib import Path

from make_qwen_reference import load_shared, sha256_of  # this folder: the script's own

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

REFERENCE = Path(__file__).resolve().parent / "gemma-3-270m-q4_k_m.reference.json"
SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
QUESTION = "Explain in simple words why the sky is blue during the day and red at sunset."
# Gemma 3's chat format for one user turn, as make_reference.py writes it (the GGUF has none)
PROMPTS = {
    "chat_sky_blue_and_red": f"<start_of_turn>user\n{QUESTION}<end_of_turn>\n<start_of_turn>model\n"
}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", type=Path, required=True)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    if sha256_of(args.gguf) != SHA256:
        raise SystemExit(f"{args.gguf}: sha256 differs from {SHA256}")

    ref = load_shared()
    torch = ref.torch
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    folder, name = str(args.gguf.parent), args.gguf.name
    tok = ref.AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = ref.AutoModelForCausalLM.from_pretrained(
        folder, gguf_file=name, dtype=torch.float32, attn_implementation="eager"
    )
    model.eval()

    doc = json.loads(REFERENCE.read_text())
    stop_ids = doc["stop_token_ids"]
    for pname, text in PROMPTS.items():
        doc["prompts"][pname] = ref.run_prompt(model, tok, text, stop_ids)
        print(f"{pname}: P={doc['prompts'][pname]['n_prompt_tokens']} "
              f"text={doc['prompts'][pname]['greedy']['text']!r}", flush=True)
    doc["added_prompts"] = {
        "names": sorted(PROMPTS),
        "made_by": "tests/reference/make_gemma_chat_reference.py (make_reference.run_prompt)",
        "versions": {"torch": torch.__version__, "transformers": ref.transformers.__version__},
    }
    with REFERENCE.open("w") as f:
        json.dump(doc, f, indent=1, ensure_ascii=False)
    print("wrote", REFERENCE, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
