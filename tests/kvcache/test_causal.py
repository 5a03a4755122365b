"""Cache masks drawn as grids: rows are the batch's tokens, columns the cells the cache shows;
0 = visible, x = masked."""

import pytest
import torch

from ember.batch import Batch
from ember.kvcache import CacheFullError, CausalCache, WrapperCache


def grid(rows: str) -> torch.Tensor:
    lines = [line.split() for line in rows.strip().splitlines()]
    return torch.tensor([[0.0 if c == "0" else float("-inf") for c in line] for line in lines])


def mask_of(cache: CausalCache, batch: Batch) -> torch.Tensor:
    cache.start_forward(batch)
    mask = cache.mask
    if mask is None:
        return torch.zeros(len(batch), cache.hi - cache.lo)
    return mask


def batch(positions: list[int], seqs: list[int] | None = None) -> Batch:
    seqs = seqs or [0] * len(positions)
    return Batch(
        tokens=tuple(positions),
        positions=tuple(positions),
        sequences=tuple(seqs),
        outputs=(len(positions) - 1,),
    )


def test_causal_mask_prefill_then_decode():
    cache = CausalCache()
    cache.init(max_sequences=1, capacity=8, max_batch=4)
    assert torch.equal(
        mask_of(cache, batch([0, 1, 2])),
        grid("""
        0 x x
        0 0 x
        0 0 0
    """),
    )
    assert cache.mask is not None
    assert torch.equal(mask_of(cache, batch([3])), grid("0 0 0 0"))
    assert cache.mask is None  # nothing masked: plain attention


def test_swa_mask_slides_past_window():
    cache = CausalCache(window=2)
    cache.init(max_sequences=1, capacity=8, max_batch=4)
    assert torch.equal(
        mask_of(cache, batch([0, 1, 2, 3])),
        grid("""
        0 x x x
        0 0 x x
        x 0 0 x
        x x 0 0
    """),
    )
    # cells of positions 0-2 are out of every later query's window: freed, and position 4
    # takes cell 0 (the cache holds window - 1 earlier keys a sequence, plus a batch)
    assert cache.num_cells == 2 + 4
    assert torch.equal(mask_of(cache, batch([4])), grid("0 x x 0"))
    assert cache.cell_pos.tolist() == [4, -1, -1, 3, -1, -1]


def test_two_sequences_never_see_each_other():
    cache = CausalCache()
    cache.init(max_sequences=2, capacity=4, max_batch=4)
    assert torch.equal(
        mask_of(cache, batch([0, 1, 0, 1], [0, 0, 1, 1])),
        grid("""
        0 x x x
        0 0 x x
        x x 0 x
        x x 0 0
    """),
    )
    assert torch.equal(
        mask_of(cache, batch([2, 2], [1, 0])),
        grid("""
        x x 0 0 0 x
        0 0 x x x 0
    """),
    )


def test_copy_prefix_shares_cells():
    cache = CausalCache()
    cache.init(max_sequences=2, capacity=4, max_batch=4)
    mask_of(cache, batch([0, 1, 2]))
    cache.copy_prefix(0, 1, 2)
    assert torch.equal(mask_of(cache, batch([2], [1])), grid("0 0 x 0"))


def test_remove_shifts_later_positions_and_rerotates_keys():
    shifted = []

    def shift(layer: int, key: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        shifted.append(delta.tolist())
        return key + delta[None, :, None]

    cache = CausalCache(shift=shift)
    cache.init(max_sequences=1, capacity=8, max_batch=8)
    cache.start_forward(batch([0, 1, 2, 3, 4]))
    cache.set_layer(0)
    cache.put(torch.zeros(5, 1, 2), torch.zeros(5, 1, 2))
    cache.remove(0, 1, 3)
    assert cache.cell_pos.tolist()[:5] == [0, -1, -1, 1, 2]
    assert shifted == [[-2, -2]]
    assert cache.keys[0][0, 3:5, 0].tolist() == [-2.0, -2.0]
    # cells 0..4: the new token took free cell 1; cell 2 stays empty
    assert torch.equal(mask_of(cache, batch([3])), grid("0 0 x 0 0"))


def test_full_cache_is_an_error():
    cache = CausalCache()
    cache.init(max_sequences=1, capacity=2, max_batch=2)
    cache.start_forward(batch([0, 1]))
    with pytest.raises(CacheFullError):
        cache.start_forward(batch([2]))


def test_can_resume_with_window():
    cache = CausalCache(window=2)
    cache.init(max_sequences=1, capacity=8, max_batch=8)
    cache.start_forward(batch([0, 1, 2, 3]))
    assert cache.can_resume(0, 4) and cache.can_resume(0, 2)
    assert not cache.can_resume(0, 5)


def test_wrapper_routes_layers_to_their_cache():
    local, full = CausalCache(window=1), CausalCache()
    cache = WrapperCache([local, full], [0, 1])
    cache.init(max_sequences=1, capacity=4, max_batch=4)
    cache.start_forward(batch([0, 1]))
    for layer in (0, 1):
        cache.set_layer(layer)
        cache.put(torch.full((2, 1, 1), float(layer)), torch.zeros(2, 1, 1))
    cache.set_layer(0)
    assert torch.equal(cache.get()[2], grid("0 x\nx 0"))
    cache.set_layer(1)
    assert torch.equal(cache.get()[2], grid("0 x\n0 0"))
    assert full.keys[1][0, :2, 0].tolist() == [1.0, 1.0] and 1 not in local.keys


def test_chunked_mask_sees_only_the_current_chunk():
    cache = CausalCache(chunk=3)
    cache.init(max_sequences=1, capacity=8, max_batch=8)
    assert torch.equal(
        mask_of(cache, batch([0, 1, 2, 3, 4])),
        grid("""
        0 x x x x
        0 0 x x x
        0 0 0 x x
        x x x 0 x
        x x x 0 0
    """),
    )
    assert torch.equal(mask_of(cache, batch([5, 6])), grid("x x x 0 0 0 x\nx x x x x x 0"))


def test_chunked_with_two_sequences():
    cache = CausalCache(chunk=2)
    cache.init(max_sequences=2, capacity=4, max_batch=6)
    assert torch.equal(
        mask_of(cache, batch([0, 1, 2, 0, 1, 2], [0, 0, 0, 1, 1, 1])),
        grid("""
        0 x x x x x
        0 0 x x x x
        x x 0 x x x
        x x x 0 x x
        x x x 0 0 x
        x x x x x 0
    """),
    )


def test_window_and_chunk_are_exclusive():
    with pytest.raises(ValueError):
        CausalCache(window=2, chunk=2)


def test_encoder_cache_stores_once_and_shows_everything():
    from ember.kvcache import EncoderCache

    cache = EncoderCache()
    cache.init(max_sequences=2, capacity=16, max_batch=8)
    image = Batch((5, 6, 7), (0, 1, 2), (0, 0, 0), (2,), multimodal=(1,))
    cache.start_forward(image)
    cache.set_layer(0)
    cache.put(torch.ones(4, 1, 2), torch.full((4, 1, 2), 2.0))  # 4 encoder positions
    k, v, mask = cache.get()
    assert k.shape == (1, 4, 2) and mask is None and cache.is_cached
    assert cache.image_position(0) == 1
    cache.start_forward(batch([3]))  # text only: the stored output stays
    cache.put(torch.zeros(1, 1, 2), torch.zeros(1, 1, 2))
    k, v, _ = cache.get()
    assert torch.equal(v, torch.full((1, 4, 2), 2.0))
    cache.start_forward(batch([4, 0], [0, 1]))  # another sequence, no image: nothing to see
    assert cache.image_position(1) is None
    cache.remove(0, 2, None)  # after the image: kept
    assert cache.is_cached
    cache.remove(0, 1, 2)  # the image's input: dropped
    assert not cache.is_cached
    with pytest.raises(LookupError):
        cache.get()
    two = Batch((5, 6), (0, 0), (0, 1), (1,), multimodal=(0, 1))
    cache.start_forward(two)
    with pytest.raises(ValueError):  # two sequences' images: each is stored by its sequence
        cache.put(torch.ones(4, 1, 2), torch.ones(4, 1, 2))


def test_wrapper_of_encoder_and_causal_as_mllama():
    from ember.kvcache import EncoderCache

    enc, causal = EncoderCache(), CausalCache()
    cache = WrapperCache([enc, causal], [1, 0, 1])  # layer 1 cross-attends
    cache.init(max_sequences=1, capacity=4, max_batch=4)
    cache.start_forward(Batch((1, 2), (0, 1), (0, 0), (1,), multimodal=(0,)))
    for layer in range(3):
        cache.set_layer(layer)
        cache.put(torch.full((2, 1, 1), float(layer)), torch.zeros(2, 1, 1))
    cache.set_layer(1)
    assert cache.get()[2] is None and cache.get()[0].flatten().tolist() == [1.0, 1.0]
    cache.set_layer(2)
    assert torch.equal(cache.get()[2], grid("0 x\n0 0"))


def test_one_sequences_prompt_batch_after_batch_is_plain_causal():
    cache = CausalCache()
    cache.init(max_sequences=2, capacity=8, max_batch=4)
    cache.start_forward(batch([0, 1, 2]))
    assert cache.plain_causal()
    cache.start_forward(batch([3, 4]))  # after its cached cells: still plain causal
    assert cache.plain_causal()
    cache.start_forward(batch([0, 1, 0, 1], [1, 1, 0, 0]))  # two sequences apart
    assert not cache.plain_causal()
    windowed = CausalCache(window=2)
    windowed.init(max_sequences=1, capacity=8, max_batch=4)
    windowed.start_forward(batch([0, 1]))  # the window hides nothing yet
    assert windowed.plain_causal()
    windowed.start_forward(batch([2, 3, 4, 5]))  # a band
    assert not windowed.plain_causal()
    band = windowed.sliding_band()  # position 2 took cell 0 (freed): cells in order of position
    assert band is not None and band[0].tolist() == [1, 0, 2, 3, 4] and band[1] == 2
    wrapper = WrapperCache([windowed, cache], [0, 1])
    wrapper.start_forward(batch([6, 7], [1, 1]))  # sequence 1 is new to windowed, not to cache
    wrapper.set_layer(0)
    assert wrapper.plain_causal()
    wrapper.set_layer(1)  # sequence 0's cells lie between sequence 1's: masked in the middle
    assert not wrapper.plain_causal()
    assert wrapper.sliding_band() is None  # no window there
