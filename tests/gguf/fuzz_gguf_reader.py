"""The coverage-guided fuzz of the GGUF reader with atheris (libFuzzer): run by
test_gguf_fuzz_coverage.py, bounded by -max_total_time; a crash, a hang (-timeout) or a huge
allocation (-rss_limit_mb) leaves a file beside -artifact_prefix.

    python tests/gguf/fuzz_gguf_reader.py -max_total_time=60 CORPUS_DIR SEED_DIR
"""

import sys

import atheris

with atheris.instrument_imports(include=["ember.gguf", "gguf_fuzz_target"]):
    from gguf_fuzz_target import read_any


def main() -> None:
    atheris.Setup(sys.argv, read_any)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
