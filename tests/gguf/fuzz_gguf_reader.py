"""The coverage-guided fuzz of the GGUF reader with atheris (libFuzzer): run by
test_gguf_fuzz_coverage.py, bounded by -max_total_time; a crash, a hang (-timeout) or a huge
allocation (a MemoryError under the 2 GiB address-space limit set below) leaves a file beside
-artifact_prefix.

    python tests/gguf/fuzz_gguf_reader.py -max_total_time=60 CORPUS_DIR SEED_DIR
"""

import resource
import sys

import atheris

# A huge allocation fails here rather than through libFuzzer's -rss_limit_mb: that one reads the
# peak RSS, which Linux carries over exec from the parent that forked this process (a pytest
# that has loaded models is already past any sensible limit).
resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))

with atheris.instrument_imports(include=["ember.gguf", "gguf_fuzz_target"]):
    from gguf_fuzz_target import read_any


def main() -> None:
    atheris.Setup(sys.argv, read_any)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
