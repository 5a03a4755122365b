"""Strict name-based binding of GGUF tensors to a model: a missing or mis-shaped tensor fails
loudly."""

import torch

from ember.backend.embedding import Embedding
from ember.backend.precision import activation_passes
from ember.backend.quant import dequantize
from ember.backend.weights import (
    AnyLinear,
    FusedLinear,
    concat_linear,
    expert_linears,
    linear_from_gguf,
)
from ember.gguf import GGUFFile, TensorInfo
from ember.model.config import ModelLoadError


class RenamedGGUF:
    """A GGUF file whose tensors Weights sees under other names (names: ours -> the file's):
    an mmproj file written with llama.cpp's names, read as Ollama's."""

    def __init__(self, gguf: GGUFFile, names: dict[str, str]) -> None:
        self.gguf, self.metadata, self.names = gguf, gguf.metadata, names
        self.tensors = {ours: gguf.tensors[name] for ours, name in names.items()}

    def raw(self, name: str) -> object:
        return self.gguf.raw(self.names[name])

    def release(self, name: str) -> None:
        self.gguf.release(self.names[name])


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

    def shape(self, name: str) -> tuple[int, ...]:
        """A tensor's shape (torch order), for a size the metadata leaves out."""
        info = self.gguf.tensors.get(name)
        if info is None:
            raise ModelLoadError(f"the model file lacks the tensor {name!r}")
        return info.shape

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

    def linear(self, name: str, out_features: int, in_features: int) -> AnyLinear:
        """A projection kept as its GGUF blocks (native kernels, or torch without them); F32
        tensors as dense float32."""
        info = self._info(name, (out_features, in_features))
        return linear_from_gguf(
            self.gguf.raw(name),
            info.ggml_type,
            info.shape,
            passes=activation_passes(name),
        )

    def fused(self, names: list[str], outs: list[int], in_features: int) -> AnyLinear:
        """Several projections of the same input as one call (q/k/v, gate/up): stacked blocks
        where all have one type, else the parts side by side (never expanded)."""
        parts = [self.linear(n, o, in_features) for n, o in zip(names, outs, strict=True)]
        fused = concat_linear(parts)
        if len(parts) > 1 and not isinstance(fused, FusedLinear):
            for name in names:  # copied into one tensor: the file's pages need not stay resident
                self.gguf.release(name)
        return fused

    def experts(
        self, name: str, num_experts: int, out_features: int, in_features: int
    ) -> list[AnyLinear]:
        """A 3-D stack of expert weights (experts, out, in), one projection per expert, each
        kept as its slice of the file's blocks."""
        info = self._info(name, (num_experts, out_features, in_features))
        return expert_linears(
            self.gguf.raw(name),
            info.ggml_type,
            info.shape,
            passes=activation_passes(name),
        )

    def output_head(self, vocab_size: int, hidden: int) -> AnyLinear:
        """`output.weight`, or the token embeddings where the model ties them."""
        head = "output.weight" if self.has("output.weight") else "token_embd.weight"
        return self.linear(head, vocab_size, hidden)

    def embedding(self, name: str, vocab_size: int, dim: int) -> Embedding:
        info = self._info(name, (vocab_size, dim))
        return Embedding.from_gguf(self.gguf.raw(name), info.ggml_type, info.shape)
