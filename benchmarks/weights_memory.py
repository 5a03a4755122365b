"""Which weights of a model run from their GGUF blocks and which are expanded, and the memory
they hold. `.venv/bin/python benchmarks/weights_memory.py smollm2:135m gemma3:270m`"""

import resource
import sys
from collections import Counter

from ember.catalog import resolve_model
from ember.gguf import GGUFFile
from ember.model import load_model


def weights_of(model: object) -> list[object]:
    found = []
    for block in [model, *getattr(model, "blocks", [])]:
        found += [v for v in vars(block).values() if hasattr(v, "kind") and hasattr(v, "nbytes")]
    return found


def main() -> None:
    for name in sys.argv[1:] or ["smollm2:135m"]:
        path = resolve_model(name)
        model = load_model(GGUFFile.open(path))
        kinds: Counter[str] = Counter()
        for w in weights_of(model):
            kinds[w.kind] += w.nbytes  # type: ignore[attr-defined]
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        held = ", ".join(f"{k}: {v / 1e6:.0f} MB" for k, v in sorted(kinds.items()))
        print(f"{name}: file {path.stat().st_size / 1e6:.0f} MB; projections {held}; "
              f"peak RSS after load {rss:.0f} MB")


if __name__ == "__main__":
    main()
