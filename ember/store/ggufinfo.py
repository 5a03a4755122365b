"""What the store records about a GGUF file (Ollama's config blob fields), read with Ember's own
validating reader: architecture, parameter count, file type, and which kind of layer it is."""

import math
from dataclasses import dataclass
from pathlib import Path

from ember.gguf import GGUFError, GGUFFile
from ember.store import manifest as mt
from ember.store.errors import CreateError

# llama_ftype numbers -> Ollama's names (fs/ggml/type.go); 4-6 and 33-35 are retired.
FILE_TYPES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
    11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S",
    17: "Q5_K_M", 18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS",
    23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S",
    29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16", 36: "TQ1_0", 37: "TQ2_0",
    38: "MXFP4_MOE", 39: "NVFP4", 40: "Q1_0",
}  # fmt: skip
GGUF_MAGIC = b"GGUF"


@dataclass(frozen=True, slots=True)
class GGUFInfo:
    media_type: str  # model, projector (adapters are refused)
    architecture: str
    num_params: int
    file_type: str  # "Q4_K_M", "F16", ... or "unknown"


def read_gguf_info(path: Path, label: str) -> GGUFInfo:
    """Parses the GGUF at `path` (a blob: untrusted); `label` names it in errors."""
    with open(path, "rb") as f:
        if f.read(4) != GGUF_MAGIC:
            raise CreateError(f"supplied file was not in GGUF format: {label}")
    try:
        with GGUFFile.open(path) as gguf:
            return _info(gguf, label)
    except GGUFError as e:
        raise CreateError(f"{label} is not a valid GGUF file: {e}") from None


def _info(gguf: GGUFFile, label: str) -> GGUFInfo:
    arch = gguf.get("general.architecture", "")
    kind = gguf.get("general.type", "")
    if kind == "adapter":
        raise CreateError(f"{label} is a LoRA adapter: adapters are not supported")
    media_type = mt.MEDIA_MODEL
    if kind in ("projector", "mmproj") or arch == "clip":
        media_type = mt.MEDIA_PROJECTOR
    ftype = gguf.get("general.file_type")
    return GGUFInfo(
        media_type=media_type,
        architecture=arch if isinstance(arch, str) else "",
        num_params=sum(math.prod(t.shape) for t in gguf.tensors.values()),
        file_type=FILE_TYPES.get(ftype, "unknown") if isinstance(ftype, int) else "unknown",
    )
