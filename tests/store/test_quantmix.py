"""The type each tensor gets in a Q8_0, Q4_K_M or Q4_K_S file (ember.store.quantmix), on the
tensor lists of llama-like models: llama.cpp's llama_tensor_get_type rules."""

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gguf as gguf_py
import numpy as np
import pytest

from ember.gguf import GGMLType, GGUFFile, TensorInfo
from ember.store.quantmix import tensor_types

F32, Q4_K, Q5_K, Q6_K = GGMLType.F32, GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K


@dataclass
class FakeGGUF:
    """What tensor_types reads of a GGUFFile: tensor infos and metadata."""

    tensors: dict[str, TensorInfo]
    metadata: dict[str, Any] = field(default_factory=dict)


def tensor(name: str, *shape: int, ggml_type: GGMLType = GGMLType.F16) -> TensorInfo:
    return TensorInfo(name, shape, ggml_type, 0, 0)


def model(layers: int, *, hidden: int = 256, ffn: int = 512, tied: bool = False) -> FakeGGUF:
    """The tensors of a llama-like model, in llama.cpp's converter's order."""
    infos = [tensor("token_embd.weight", 1000, hidden)]
    for i in range(layers):
        infos += [
            tensor(f"blk.{i}.attn_norm.weight", hidden, ggml_type=F32),
            tensor(f"blk.{i}.attn_q.weight", hidden, hidden),
            tensor(f"blk.{i}.attn_k.weight", hidden // 2, hidden),
            tensor(f"blk.{i}.attn_v.weight", hidden // 2, hidden),
            tensor(f"blk.{i}.attn_output.weight", hidden, hidden),
            tensor(f"blk.{i}.ffn_gate.weight", ffn, hidden),
            tensor(f"blk.{i}.ffn_up.weight", ffn, hidden),
            tensor(f"blk.{i}.ffn_down.weight", hidden, ffn),
        ]
    infos.append(tensor("output_norm.weight", hidden, ggml_type=F32))
    if not tied:
        infos.append(tensor("output.weight", 1000, hidden))
    meta = {"general.architecture": "llama", "llama.block_count": layers}
    return FakeGGUF({t.name: t for t in infos}, meta)


def types(gguf: FakeGGUF, file_type: str) -> dict[str, GGMLType]:
    return tensor_types(gguf, file_type)  # type: ignore[arg-type]


def layers_with(chosen: dict[str, GGMLType], kind: str, ggml_type: GGMLType) -> list[int]:
    return [int(n.split(".")[1]) for n, t in chosen.items() if f".{kind}." in n and t == ggml_type]


def test_q4_k_m_gives_more_bits_to_attn_v_and_ffn_down_of_some_layers() -> None:
    chosen = types(model(16), "Q4_K_M")
    # use_more_bits(i, 16): i < 2, i >= 14, or (i - 2) % 3 == 2
    more = [0, 1, 4, 7, 10, 13, 14, 15]
    assert layers_with(chosen, "attn_v", Q6_K) == more
    assert layers_with(chosen, "ffn_down", Q6_K) == more
    assert chosen["output.weight"] == Q6_K
    assert chosen["token_embd.weight"] == Q4_K  # not tied: an input table only
    for kind in ("attn_q", "attn_k", "attn_output", "ffn_gate", "ffn_up"):
        assert layers_with(chosen, kind, Q4_K) == list(range(16))


def test_q4_k_s_gives_q5_k_to_the_first_layers() -> None:
    chosen = types(model(16), "Q4_K_S")
    assert layers_with(chosen, "attn_v", Q5_K) == [0, 1, 2, 3]
    assert layers_with(chosen, "ffn_down", Q5_K) == [0, 1]  # the first eighth
    assert chosen["output.weight"] == Q6_K
    assert set(chosen.values()) == {Q4_K, Q5_K, Q6_K, F32}


@pytest.mark.parametrize("file_type", ["Q4_K_M", "Q4_K_S"])
def test_tied_embedding_is_quantized_as_the_output(file_type: str) -> None:
    assert types(model(2, tied=True), file_type)["token_embd.weight"] == Q6_K


def test_norms_and_vectors_keep_their_type() -> None:
    chosen = types(model(2), "Q4_K_M")
    assert chosen["blk.0.attn_norm.weight"] == F32 and chosen["output_norm.weight"] == F32


def test_rows_that_are_no_whole_k_block_fall_back_as_llama_cpp() -> None:
    chosen = types(model(8, hidden=96, ffn=160), "Q4_K_M")  # rows of 96 and 160
    assert chosen["blk.1.attn_q.weight"] == GGMLType.Q5_0  # Q4_K -> Q5_0
    assert chosen["blk.0.attn_v.weight"] == GGMLType.Q8_0  # Q6_K -> Q8_0
    assert chosen["output.weight"] == GGMLType.Q8_0  # the output: Q8_0 when Q4_K does not fit
    assert types(model(8, hidden=96), "Q4_K_S")["blk.0.attn_v.weight"] == GGMLType.Q5_1
    assert types(model(2, hidden=40), "Q4_K_M")["blk.0.attn_q.weight"] == GGMLType.F16


def test_q8_0_makes_every_weight_matrix_q8_0() -> None:
    chosen = types(model(4, tied=True), "Q8_0")
    assert {t for n, t in chosen.items() if "norm" not in n} == {GGMLType.Q8_0}


@pytest.mark.parametrize("file_type", ["F32", "F16", "BF16"])
def test_a_float_file_type_gives_every_weight_matrix_that_type(file_type: str) -> None:
    chosen = types(model(4, tied=True), file_type)
    assert {t for n, t in chosen.items() if "norm" not in n} == {GGMLType[file_type]}
    assert chosen["output_norm.weight"] == F32


def test_eight_experts_bump_attention_as_llama_cpp() -> None:
    gguf = model(8)
    gguf.metadata["llama.expert_count"] = 8
    chosen = types(gguf, "Q4_K_M")
    assert chosen["blk.2.attn_v.weight"] == chosen["blk.2.attn_k.weight"] == GGMLType.Q8_0
    assert chosen["blk.2.attn_output.weight"] == Q5_K


def test_real_reader_gives_the_same_choice(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    writer = gguf_py.GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    writer.add_tensor("blk.0.attn_v.weight", np.zeros((4, 256), np.float16))
    writer.add_tensor("blk.0.attn_norm.weight", np.zeros(256, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with GGUFFile.open(path) as gguf:
        chosen = tensor_types(gguf, "Q4_K_M")
    assert chosen == {"blk.0.attn_v.weight": Q6_K, "blk.0.attn_norm.weight": F32}
