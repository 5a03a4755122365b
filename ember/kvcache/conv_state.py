"""The state of short causal convolutions (LFM2's `shortconv` layers): what a sequence's next
token convolves with is the inputs of its last `kernel - 1` tokens, per layer, so each sequence
keeps a short history of them instead of keys and values.

The history holds the last HISTORY inputs of each sequence (more than the kernel needs), so that
a sequence can step back a little, as the runner asks when it evaluates a prompt's last token
again, or drops a draft model's rejected tokens. A sequence can resume at a position only where
the inputs before it are still held: never from the middle of an older conversation (Ollama's
recurrent cache keeps checkpoints for that; here such a prompt is evaluated again). A context
shift drops old tokens and keeps the newest, so the convolution's state stays as it is."""

import torch

from ember.batch import Batch

HISTORY = 64  # inputs kept per sequence and layer, the newest last


class ConvStateCache:
    def __init__(self, kernel: int) -> None:
        self.kernel = kernel  # the convolution's length: it sees kernel - 1 earlier inputs
        self.max_sequences = 0
        self.history: dict[int, torch.Tensor] = {}  # layer -> (sequences, HISTORY, channels)
        self.length: list[int] = []  # positions each sequence holds
        self.known: list[int] = []  # of them, the newest whose inputs the history holds
        self.rows: list[tuple[int, torch.Tensor]] = []  # the batch's (sequence, its rows)
        self.reserve = False
        self.layer = 0

    # --- used by the runner ---
    def init(
        self, *, max_sequences: int, capacity: int, max_batch: int,
        dtype: torch.dtype | str | None = None,
    ) -> None:  # fmt: skip
        self.max_sequences = max_sequences
        self.history.clear()
        self.length, self.known = [0] * max_sequences, [0] * max_sequences

    def nbytes(self) -> int:
        return sum(h.numel() * h.element_size() for h in self.history.values())

    def planned_bytes(self, *, max_sequences: int, capacity: int, max_batch: int) -> int:
        return self.nbytes()  # it does not grow with the context

    def start_forward(self, batch: Batch, *, reserve: bool = False) -> None:
        self.reserve = reserve
        by_seq: dict[int, list[int]] = {}
        for i, seq in enumerate(batch.sequences):
            by_seq.setdefault(seq, []).append(i)
        self.rows = []
        for seq, rows in by_seq.items():
            rows.sort(key=lambda i: batch.positions[i])
            first = batch.positions[rows[0]]
            if not reserve:
                if first != self.length[seq]:
                    raise ValueError(f"sequence {seq} resumes at {first}, its state at "
                                     f"{self.length[seq]}")  # fmt: skip
                self.length[seq] = first + len(rows)
                self.known[seq] = min(HISTORY, self.known[seq] + len(rows))  # once each layer ran
            self.rows.append((seq, torch.tensor(rows)))

    def copy_prefix(self, src: int, dst: int, length: int) -> None:
        self.length[dst], self.known[dst] = self.length[src], self.known[src]
        with torch.inference_mode():  # the history was made in the forward's inference mode
            for history in self.history.values():
                history[dst] = history[src]
        self.remove(dst, length, None)

    def remove(self, seq: int, begin: int, end: int | None) -> None:
        held = self.length[seq]
        if begin >= held:
            return
        if end is not None:  # a shift: the newest inputs stay, older positions move down
            dropped = min(end, held) - begin
            self.length[seq] = held - dropped
            self.known[seq] = min(self.known[seq], self.length[seq] - begin)
            return
        back = held - begin  # the newest `back` inputs go: the history steps back
        with torch.inference_mode():  # the history was made in the forward's inference mode
            for history in self.history.values():
                history[seq] = torch.roll(history[seq], back, dims=0)
                history[seq, :back] = 0
        self.length[seq], self.known[seq] = begin, max(0, self.known[seq] - back)

    def can_resume(self, seq: int, pos: int) -> bool:
        """Whether the inputs of the kernel - 1 tokens before pos are held."""
        held, needed = self.length[seq], min(pos, self.kernel - 1)
        return pos == 0 or (pos <= held and held - pos + needed <= self.known[seq])

    # --- used by models ---
    def set_layer(self, layer: int) -> None:
        self.layer = layer

    def put(self, key: torch.Tensor, value: torch.Tensor) -> None:
        raise TypeError("a convolution layer keeps no keys and values")

    def get(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        raise TypeError("a convolution layer keeps no keys and values")

    def view(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None] | None:
        raise TypeError("a convolution layer keeps no keys and values")

    def convolve(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """The batch's inputs x (T, C) of the current layer through the depthwise causal
        convolution weight (C, kernel), each sequence after its own earlier inputs; those are
        kept for its next tokens (not in a reservation's dry run)."""
        history = self.history.get(self.layer)
        if history is None:
            history = torch.zeros(self.max_sequences, HISTORY, x.shape[1], dtype=x.dtype)
            self.history[self.layer] = history
        out = torch.empty_like(x)
        k = self.kernel
        for seq, rows in self.rows:
            own = x[rows]
            padded = torch.cat([history[seq, HISTORY - (k - 1) :], own])  # (k - 1 + n, C)
            out[rows] = sum(padded[j : j + len(own)] * weight[:, j] for j in range(k))
            if not self.reserve:
                history[seq] = torch.cat([history[seq], own])[-HISTORY:]
        return out
