"""Input cache slots: Ollama's shift vectors, slot choice, prefix reuse, shift fallback."""

import pytest
import torch

from ember.batch import Batch
from ember.kvcache import CausalCache
from ember.runner.inputcache import InputCache, NoFreeSlotError, common_prefix, shift_discard


@pytest.mark.parametrize(
    ("num_keep", "length", "discard"),
    [  # Ollama's cache_test.go TestShiftDiscard, num_ctx 2048
        (5, 2048, 1021),
        (2047, 2048, 1),
        (0, 2048, 1024),
        (5, 5000, 3973),
        (2047, 5000, 2953),
        (5, 512, 0),
    ],
)
def test_shift_discard_vectors(num_keep, length, discard):
    assert shift_discard(length, 2048, num_keep) == discard


def filled(num_slots: int, contents: list[list[int]], *, multiuser: bool = False) -> InputCache:
    cache = CausalCache(shift=lambda layer, k, delta: k)
    cache.init(max_sequences=num_slots, capacity=32, max_batch=32)
    ic = InputCache(cache, num_ctx=32, num_slots=num_slots, multiuser=multiuser)
    for slot, tokens in zip(ic.slots, contents, strict=False):
        if tokens:
            batch = Batch.single(tokens, 0, seq=slot.id)
            cache.start_forward(batch)
            cache.set_layer(0)
            cache.put(torch.zeros(len(tokens), 1, 1), torch.zeros(len(tokens), 1, 1))
            slot.inputs = list(tokens)
            slot.last_used = 100 + slot.id  # used more recently than the empty slots
    return ic


def test_common_prefix():
    assert common_prefix([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix([], [1]) == 0
    assert common_prefix([1, 2], [1, 2, 3]) == 2


def test_takes_the_free_slot_with_the_longest_prefix():
    ic = filled(3, [[1, 2], [1, 2, 3, 4], [9]])
    slot, num_past = ic.load([1, 2, 3, 5])
    assert (slot.id, num_past, slot.inputs) == (1, 3, [1, 2, 3])
    slot2, num_past2 = ic.load([1, 2, 3, 5])  # slot 1 is busy now
    assert (slot2.id, num_past2) == (0, 2)


def test_a_fully_cached_prompt_still_evaluates_its_last_token():
    ic = filled(1, [[1, 2, 3]])
    slot, num_past = ic.load([1, 2, 3])
    assert num_past == 2 and slot.inputs == [1, 2]


def kept(ic: InputCache, slot_id: int, at: int) -> torch.Tensor:
    """Logits kept in a slot after its first `at` inputs, as the engine keeps a prompt's."""
    slot = ic.slots[slot_id]
    held, slot.inputs = slot.inputs, slot.inputs[:at]
    logits = torch.arange(5.0) + at
    slot.keep_logits(logits)
    slot.inputs = held
    return logits


def test_a_whole_prompt_with_its_kept_logits_evaluates_nothing():
    ic = filled(1, [[1, 2, 3, 4, 5]])  # a prompt of 3, then 2 generated tokens
    logits = kept(ic, 0, 3)
    slot, num_past = ic.load([1, 2, 3])
    assert (num_past, slot.inputs, slot.logits_at) == (3, [1, 2, 3], 3)
    assert torch.equal(slot.logits, logits)
    ic.release(slot)
    slot, num_past = ic.load([1, 2, 3])  # and again: kept for every request of that prompt
    assert (num_past, slot.logits_at) == (3, 3)


@pytest.mark.parametrize("prompt", [[1, 2], [1, 2, 3, 4], [1, 2, 3, 4, 5, 6], [1, 9, 3]])
def test_kept_logits_serve_only_the_prompt_they_followed(prompt):
    ic = filled(1, [[1, 2, 3, 4, 5]])
    kept(ic, 0, 3)
    slot, num_past = ic.load(prompt)
    assert num_past == min(len(prompt) - 1, common_prefix(prompt, [1, 2, 3, 4, 5]))
    # cut before the input they followed, they go; cut after it, they still follow [1, 2, 3]
    assert slot.logits_at == (3 if num_past >= 3 else 0)


def test_a_shift_drops_the_kept_logits():
    ic = filled(1, [list(range(1, 31))])
    kept(ic, 0, 30)
    ic.shift(ic.slots[0], num_keep=4)
    assert ic.slots[0].logits_at == 0
    inputs = list(ic.slots[0].inputs)
    _, num_past = ic.load(inputs)  # the same inputs, their cells moved: the last runs again
    assert num_past == len(inputs) - 1


def test_multiuser_takes_kept_logits_only_where_they_stay():
    ic = filled(2, [[1, 2, 3], []], multiuser=True)
    kept(ic, 0, 3)
    slot, num_past = ic.load([1, 2, 3])
    assert (slot.id, num_past) == (0, 3)
    other, num_past = ic.load([1, 2, 3])  # slot 0 is busy: its prefix is copied, not its logits
    assert (other.id, num_past, other.logits_at) == (1, 2, 0)


def test_an_empty_prompt_reuses_nothing_and_keeps_no_input():
    # it had found -1 cached tokens (the last token evaluated again, of none), which dropped
    # the slot's last input and failed the server's prefix-hit counter
    ic = filled(1, [[1, 2, 3]])
    slot, num_past = ic.load([])
    assert num_past == 0 and slot.inputs == []


def test_no_free_slot_is_an_error():
    ic = filled(1, [[]])
    ic.load([1])
    with pytest.raises(NoFreeSlotError):
        ic.load([1])


def test_multiuser_reuses_a_slot_that_is_wholly_a_prefix():
    ic = filled(2, [[1, 2, 3], []], multiuser=True)
    slot, num_past = ic.load([1, 2, 3, 4, 5])
    assert (slot.id, num_past) == (0, 3)


def test_multiuser_copies_a_longer_prefix_into_the_oldest_slot():
    ic = filled(2, [[1, 2, 3, 4], []], multiuser=True)
    slot, num_past = ic.load([1, 2, 3, 9])
    assert (slot.id, num_past, slot.inputs) == (1, 3, [1, 2, 3])
    cache = ic.cache
    assert isinstance(cache, CausalCache)
    shared = ((cache.cell_seqs & 0b11) == 0b11).sum()
    assert int(shared) == 3  # cells shared, not copied
    assert ic.slots[0].inputs == [1, 2, 3, 4]


def test_shift_drops_half_after_num_keep():
    ic = filled(1, [list(range(32))])
    slot = ic.slots[0]
    assert ic.shift(slot, 4) == []
    assert slot.inputs == [0, 1, 2, 3, *range(18, 32)]


def test_shift_of_shared_cells_falls_back_to_evaluating_again():
    ic = filled(2, [list(range(32)), []], multiuser=True)
    slot, _ = ic.load([*list(range(30)), 99])  # shares 30 cells with slot 0
    again = ic.shift(slot, 2)
    assert slot.inputs == [] and again == [0, 1, *range(15, 30)]  # 13 dropped


def test_shift_discard_drops_a_group_it_would_cut_whole():
    # half of 28 after num_keep 4 ends at 18, inside the image at 15..20: the cut goes to 21
    assert shift_discard(32, 32, 4) == 14
    assert shift_discard(32, 32, 4, {15: 5}) == 17
    assert shift_discard(32, 32, 4, {18: 5}) == 14  # a group starting at the cut stays
    assert shift_discard(32, 32, 4, {2: 1, 25: 3}) == 14  # groups away from the cut


def test_shift_moves_a_slots_images_whether_in_place_or_evaluated_again():
    images, groups = {1: 11, 10: 22, 24: 33}, {1: 2, 10: 2, 24: 2}  # kept, dropped, moved
    ic = filled(1, [list(range(32))])
    slot = ic.slots[0]
    slot.images = dict(images)
    assert ic.shift(slot, 4, groups) == []  # 14 dropped
    assert slot.images == {1: 11, 10: 33}
    ic = filled(2, [list(range(32)), []], multiuser=True)
    ic.slots[0].images = dict(images)
    slot, _ = ic.load([*range(30), 99], images=images)  # shares 30 cells with slot 0
    again = ic.shift(slot, 4, groups)  # 12 dropped
    assert slot.inputs == [] and again == [*range(4), *range(16, 30)]
    assert slot.images == {1: 11, 12: 33}  # where they will be evaluated again
