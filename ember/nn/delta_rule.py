"""The gated delta rule (gated DeltaNet's linear attention) over one sequence's tokens, from its
state S (H, d_k, d_v): per token and head, S = exp(g) S; S += k beta (v - S^T k)^T; out = S^T q.
Without the delta (`delta=False`) it is Mamba 2's scan: S += k beta v^T (k its B, v its x,
beta its dt, q its C, g its dt A).

`step` takes one token; `chunked` takes a run of them in blocks of CHUNK, as matrix products: in
a block, with G_t the decay from the block's start to t, the values each token writes,
u = beta (v - G K S - sum_{j<t} (G_t / G_j)(k_t . k_j) u_j), solve one unit lower-triangular
system, and the outputs are (G Q) S + tril(Q K^T G_t / G_j) u. Both give the same sums, in
another order."""

import torch

CHUNK = 64


def step(
    state: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
    beta: torch.Tensor, delta: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """One token: q and k (H, d_k), v (H, d_v), g and beta (H,) -> (out (H, d_v), the state).
    The state is updated in place (one pass over it for the decay, one for the write)."""
    state.mul_(g.exp()[:, None, None])
    if delta:
        v = v - torch.bmm(k[:, None], state)[:, 0]  # (H, d_v): less S^T k
    write = (beta[:, None] * v)[:, None]  # (H, 1, d_v)
    state.baddbmm_(k[:, :, None], write)
    return torch.bmm(q[:, None], state)[:, 0], state


def chunked(
    state: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
    beta: torch.Tensor, delta: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """n tokens: q and k (n, H, d_k), v (n, H, d_v), g and beta (n, H) -> (out (n, H, d_v),
    the state after them)."""
    n = q.shape[0]
    pad = -n % CHUNK  # padded tokens (k = 0, g = 0) leave the state as it is
    q, k, v, g, beta = (
        torch.nn.functional.pad(x.transpose(0, 1), (0, 0, 0, pad) if x.dim() == 3 else (0, pad))
        .unflatten(1, (-1, CHUNK))
        for x in (q, k, v, g, beta)
    )  # (H, N, C, d) and (H, N, C)
    gc = g.cumsum(-1)  # log G_t
    causal = torch.ones(CHUNK, CHUNK, dtype=torch.bool).tril()
    ratio = (gc[..., :, None] - gc[..., None, :]).masked_fill(~causal, -torch.inf).exp()
    kb = k * beta[..., None]
    if delta:
        system = (kb @ k.transpose(-1, -2)) * ratio
        system = system.tril(-1) + torch.eye(CHUNK)  # I + M, M strictly lower
        rhs = torch.cat([v * beta[..., None], kb * gc.exp()[..., None]], dim=-1)
        solved = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)
        values, k_decayed = solved.split([v.shape[-1], k.shape[-1]], dim=-1)
    else:  # what each token writes does not depend on the state
        values, k_decayed = v * beta[..., None], torch.zeros_like(k)
    scores = (q @ k.transpose(-1, -2)) * ratio  # (H, N, C, C), lower with the diagonal
    out = torch.empty_like(v)
    for c in range(q.shape[1]):
        u = values[:, c] - k_decayed[:, c] @ state  # (H, C, d_v)
        out[:, c] = (q[:, c] * gc[:, c, :, None].exp()) @ state + scores[:, c] @ u
        last = gc[:, c, -1:]  # (H, 1)
        state = state * last.exp()[..., None] + (
            k[:, c] * (last - gc[:, c]).exp()[..., None]
        ).transpose(-1, -2) @ u
    return out.flatten(1, 2)[:, :n].transpose(0, 1), state
