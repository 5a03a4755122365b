"""The state of recurrent layers (gated DeltaNet: Qwen3.5's and Qwen3-Next's linear attention;
Mamba 2: Nemotron-H's): each sequence carries, per layer, the inputs its short convolution still
needs (ConvStateCache's history) and a recurrent state, one (d_k, d_v) matrix per head that
every token decays and updates (ember/nn/delta_rule.py).

That matrix cannot be rebuilt from a short history, so the cache keeps it at the last STATES
positions of each sequence (checkpoints, preallocated at the first forward, the reservation's):
a sequence resumes at a position only where one is held, which covers a prompt whose last token
is evaluated again and a conversation continued where the last one stopped; a prompt that
diverges earlier is evaluated again, and so is a context shift (a shift would change what every
later state summed), as Ollama's recurrent cache refuses it."""

import numpy as np
import torch

from ember.batch import Batch
from ember.kvcache.conv_state import ConvStateCache
from ember.nn import delta_rule

STATES = 4  # checkpoints kept per sequence and layer: its newest positions
KEPT = STATES - 1  # of them, those a forward writes (the one it started from stays)


class RecurrentStateCache(ConvStateCache):
    def __init__(self, kernel: int) -> None:
        super().__init__(kernel)
        self.states: dict[int, torch.Tensor] = {}  # layer -> (sequences, STATES, H, d_k, d_v)
        self.state_pos = np.full((0, STATES), -1, dtype=np.int64)  # each checkpoint's position
        self.firsts: list[int] = []  # the batch's first position of each sequence in rows

    def init(
        self, *, max_sequences: int, capacity: int, max_batch: int,
        dtype: torch.dtype | str | None = None,
    ) -> None:  # fmt: skip
        super().init(max_sequences=max_sequences, capacity=capacity, max_batch=max_batch)
        self.states.clear()
        self.state_pos = np.full((max_sequences, STATES), -1, dtype=np.int64)

    def nbytes(self) -> int:
        return super().nbytes() + sum(s.numel() * s.element_size() for s in self.states.values())

    def start_forward(self, batch: Batch, *, reserve: bool = False) -> None:
        lengths = list(self.length)
        super().start_forward(batch, reserve=reserve)
        self.firsts = [lengths[seq] for seq, _ in self.rows]
        if not reserve:  # the checkpoints a batch will write: its sequences' last positions
            for seq, rows in self.rows:
                first, held = self.length[seq] - len(rows), self.state_pos[seq]
                for pos in range(max(first, self.length[seq] - KEPT) + 1, self.length[seq] + 1):
                    # the oldest (or an empty) checkpoint but the one the batch starts from
                    slot = int(np.argmin(np.where(held == first, np.iinfo(np.int64).max, held)))
                    held[slot] = pos

    def copy_prefix(self, src: int, dst: int, length: int) -> None:
        with torch.inference_mode():
            for states in self.states.values():
                states[dst] = states[src]
        self.state_pos[dst] = self.state_pos[src]
        super().copy_prefix(src, dst, length)

    def remove(self, seq: int, begin: int, end: int | None) -> None:
        if begin >= self.length[seq]:
            return
        if end is not None:
            raise NotImplementedError("a recurrent state cannot drop tokens from its middle")
        super().remove(seq, begin, None)
        self.state_pos[seq][self.state_pos[seq] > begin] = -1

    def can_resume(self, seq: int, pos: int) -> bool:
        held = pos == 0 or pos in self.state_pos[seq]
        return held and super().can_resume(seq, pos)

    def planned_bytes(self, *, max_sequences: int, capacity: int, max_batch: int) -> int:
        return self.nbytes()

    # --- used by models ---
    def recur(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, decay: torch.Tensor,
        beta: torch.Tensor, *, delta: bool = True,
    ) -> torch.Tensor:  # fmt: skip
        """The gated delta rule (or without the delta, Mamba 2's scan) over the batch's tokens,
        each sequence from its own state: q and
        k (T, H, d_k) normalized (q scaled), v (T, H, d_v), decay (T, H) the log of each
        token's decay, beta (T, H) its write strength -> (T, H, d_v). Per token and head:
        S = S exp(decay); S += k (beta (v - S^T k))^T; out = S^T q."""
        states = self.states.get(self.layer)
        if states is None:
            h, dk, dv = v.shape[1], k.shape[2], v.shape[2]
            states = torch.zeros(self.max_sequences, STATES, h, dk, dv, dtype=torch.float32)
            self.states[self.layer] = states
        out = torch.empty_like(v)
        for (seq, rows), first in zip(self.rows, self.firsts, strict=True):
            state = self._state_at(states, seq, first, v)
            n = len(rows)
            run = max(0, n - KEPT)  # the tokens before the checkpointed ones, in blocks
            if run > KEPT:
                at = rows[:run]
                out[at], state = delta_rule.chunked(
                    state, q[at], k[at], v[at], decay[at], beta[at], delta
                )
            else:
                run = 0
            for j, row in enumerate(rows[run:].tolist(), start=run):
                out[row], state = delta_rule.step(
                    state, q[row], k[row], v[row], decay[row], beta[row], delta
                )
                pos = first + j + 1
                if not self.reserve and pos > first + n - KEPT:
                    states[seq, self._slot(seq, pos)] = state
        return out

    def _state_at(
        self, states: torch.Tensor, seq: int, pos: int, like: torch.Tensor
    ) -> torch.Tensor:
        if pos == 0 or self.reserve:
            return like.new_zeros(states.shape[2:])
        return states[seq, self._slot(seq, pos)].clone()

    def _slot(self, seq: int, pos: int) -> int:
        found = np.flatnonzero(self.state_pos[seq] == pos)
        if not found.size:
            raise ValueError(f"sequence {seq} holds no recurrent state at position {pos}")
        return int(found[0])


def current_state(cache: object) -> RecurrentStateCache:
    """The recurrent state of the layer a WrapperCache is set to (a recurrent layer's)."""
    current = getattr(cache, "current", None)
    if not isinstance(current, RecurrentStateCache):
        raise TypeError("a recurrent layer needs its RecurrentStateCache")
    return current
