"""Creating from an uploaded HF directory (Ollama's `FROM <dir>`): the blobs are laid out under
their file names in a scratch folder of the store, converted to one GGUF blob (and, for llava,
an mmproj blob: a projector layer), then removed."""

import os
import re
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

from ember.store import manifest as mt
from ember.store.errors import CreateError
from ember.store.ggufinfo import GGUFInfo, read_gguf_info
from ember.store.manifest import Layer
from ember.store.names import Digest
from ember.store.store import Store

# The subfolder files a conversion reads: a sentence-transformers module's config.json (BERT's
# 1_Pooling/config.json) and a Dense module's weights (EmbeddingGemma's 2_Dense), as Ollama's
# create uploads them.
_MODULE_FILE = re.compile(r"(?!\.\.?/)[\w.-]+/(config\.json|model\.safetensors)")


def is_hf_directory(files: Mapping[str, str]) -> bool:
    """Whether uploaded files are an HF checkpoint rather than GGUF files."""
    return any(name.endswith(".safetensors") for name in files)


def convert_files(store: Store, files: Mapping[str, str]) -> tuple[list[Layer], GGUFInfo]:
    """The model layer (then any projector layer) of the converted directory and the model's
    info; raises CreateError for a bad one."""
    # here, not at the top: the converters need torch, which the server loads for nothing else
    from ember.convert import ConvertError, convert_directory, needs_projector_file

    scratch = Path(tempfile.mkdtemp(prefix="convert-", dir=store.tmp_dir))
    try:
        for name, digest in files.items():
            if "/" in name and not _MODULE_FILE.fullmatch(name):
                raise CreateError(f"an HF model directory is flat: {name!r} is in a subfolder")
            blob = store.blob_path(Digest.parse(digest))
            if not blob.is_file():
                raise CreateError(f"blob {digest} for {name!r} is not in the store: upload it")
            (scratch / name).parent.mkdir(exist_ok=True)
            _link(blob, scratch / name)
        out, projector = scratch / "model.gguf", scratch / "mmproj.gguf"
        try:
            split = needs_projector_file(scratch)
            convert_directory(scratch, out, mmproj=projector if split else None)
        except ConvertError as e:
            raise CreateError(f"cannot convert the model: {e}") from None
        layers = [_store_blob(store, out, mt.MEDIA_MODEL)]
        if split:
            layers.append(_store_blob(store, projector, mt.MEDIA_PROJECTOR))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    info = read_gguf_info(store.blob_path(layers[0].digest), "the converted model")
    return layers, info


def _store_blob(store: Store, path: Path, media_type: str) -> Layer:
    with open(path, "rb") as f:
        blob_info = store.write_blob(f)
    return Layer(media_type, blob_info.digest, blob_info.size)


def _link(blob: Path, target: Path) -> None:
    try:
        os.link(blob, target)
    except OSError:  # another file system, or no hard links: a symlink reads the same
        target.symlink_to(blob)
