"""Strict name-based binding of GGUF tensors to a model: a missing or mis-shaped tensor fails
loudly."""

import torch

from ember.backend import native
from ember.backend.quant import as_byte_tensor, dequantize
from ember.backend.weights import Embedding, Linear, concat_linear
from ember.gguf import GGUFFile, TensorInfo
from ember.model.config import ModelLoadError


class Weights:
    """Hands out a GGUF's tensors by name, checked against the shape the model expects."""

    def __init__(self, gguf: GGUFFile) -> None:
        self.gguf = gguf

    def has(self, name: str) -> bool:
        return name in self.gguf.tensors

    def _info(self, name: str, shape: tuple[int, ...]) -> TensorInfo:
        info = self.gguf.tensors.get(name)
        if info is None:
            raise ModelLoadError(f"the model file lacks the tensor {name!r}")
        if info.shape != shape:
            raise ModelLoadError(
                f"tensor {name!r} has shape {info.shape}, the model expects {shape}"
            )
        return info

    def vocab_size(self) -> int:
        """The number of rows of the token embedding table."""
        info = self.gguf.tensors.get("token_embd.weight")
        if info is None or len(info.shape) != 2:
            raise ModelLoadError("the model file lacks a 2-D tensor 'token_embd.weight'")
        return info.shape[0]

    def tensor(self, name: str, shape: tuple[int, ...]) -> torch.Tensor:
        """A small tensor (norm weight, bias) expanded to float32."""
        info = self._info(name, shape)
        return dequantize(self.gguf.raw(name), info.ggml_type, info.shape)

    def optional(self, name: str, shape: tuple[int, ...]) -> torch.Tensor | None:
        return self.tensor(name, shape) if self.has(name) else None

    def linear(
        self, name: str, out_features: int, in_features: int
    ) -> Linear | native.NativeLinear:
        """A projection: kept in its GGUF blocks where the native kernel reads them, else the
        backend's weight (float32, exact; never the bf16 int4 kernel, whose rounding makes a
        token's result depend on its batch)."""
        info = self._info(name, (out_features, in_features))
        raw = self.gguf.raw(name)
        if info.ggml_type in native.TYPES and native.available():
            return native.NativeLinear(as_byte_tensor(raw), info.ggml_type, *info.shape)
        return Linear.from_gguf(raw, info.ggml_type, info.shape, use_int4=False)

    def fused(
        self, names: list[str], outs: list[int], in_features: int
    ) -> Linear | native.NativeLinear:
        """Several projections of the same input as one matmul (q/k/v, gate/up)."""
        parts = [self.linear(n, o, in_features) for n, o in zip(names, outs, strict=True)]
        blocks = [p for p in parts if isinstance(p, native.NativeLinear)]
        if len(blocks) == len(parts) and len({p.ggml_type for p in blocks}) == 1:
            return native.NativeLinear.concat(blocks)
        if all(isinstance(p, Linear) for p in parts):
            return concat_linear(parts)  # type: ignore[arg-type]
        return Linear.from_dense(torch.cat([p.dequantize() for p in parts]))

    def output_head(self, vocab_size: int, hidden: int) -> Linear | native.NativeLinear:
        """`output.weight`, or the token embeddings where the model ties them."""
        head = "output.weight" if self.has("output.weight") else "token_embd.weight"
        return self.linear(head, vocab_size, hidden)

    def embedding(self, name: str, vocab_size: int, dim: int) -> Embedding:
        info = self._info(name, (vocab_size, dim))
        return Embedding.from_gguf(self.gguf.raw(name), info.ggml_type, info.shape)
