"""Mixture-of-experts routing and grouping (ember/nn/moe.py) against a per-token loop."""

import torch

from ember.nn.moe import Routing, mixture, sigmoid_top_k, softmax_top_k, top_k_softmax

NUM_EXPERTS, HIDDEN = 6, 8


class Linear:
    """Experts that are plain matrices, recording every call (expert, rows)."""

    def __init__(self, seed: int = 0) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.w = torch.randn(NUM_EXPERTS, HIDDEN, HIDDEN, generator=gen)
        self.calls: list[tuple[int, int]] = []

    def __call__(self, expert: int, x: torch.Tensor) -> torch.Tensor:
        self.calls.append((expert, x.shape[0]))
        return x @ self.w[expert]


def per_token(x: torch.Tensor, routing: Routing, experts: Linear) -> torch.Tensor:
    rows = []
    for t in range(x.shape[0]):
        pairs = zip(routing.experts[t].tolist(), routing.weights[t], strict=True)
        rows.append(sum(w * (x[t] @ experts.w[e]) for e, w in pairs))
    return torch.stack(rows)


def test_the_mixture_equals_a_loop_over_tokens_with_one_call_per_used_expert():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(9, HIDDEN, generator=gen)
    logits = torch.randn(9, NUM_EXPERTS, generator=gen)
    logits[:, 5] = -1e9  # expert 5 is never chosen
    routing = softmax_top_k(logits, 3, is_normalized=False)
    experts = Linear()
    assert torch.allclose(mixture(x, routing, experts), per_token(x, routing, experts), atol=1e-5)
    called = [e for e, _ in experts.calls]
    assert called == sorted(set(called)) and 5 not in called
    assert sum(n for _, n in experts.calls) == 9 * 3


def test_softmax_top_k_picks_the_most_probable_and_may_rescale_them():
    logits = torch.tensor([[0.0, 2.0, 1.0, -1.0]])
    plain = softmax_top_k(logits, 2, is_normalized=False)
    assert plain.experts.tolist() == [[1, 2]]
    assert torch.allclose(plain.weights, torch.softmax(logits, -1)[:, [1, 2]])
    rescaled = softmax_top_k(logits, 2, is_normalized=True)
    assert torch.allclose(rescaled.weights.sum(-1), torch.ones(1))


def test_top_k_softmax_weighs_only_the_chosen_logits():
    logits = torch.tensor([[0.5, 3.0, -2.0, 1.0], [2.0, 0.0, 1.0, 4.0]])
    routing = top_k_softmax(logits, 2)
    assert routing.experts.tolist() == [[1, 3], [3, 0]]
    assert torch.allclose(routing.weights[0], torch.softmax(torch.tensor([3.0, 1.0]), -1))


def test_sigmoid_top_k_weighs_the_inputs_of_nonlinear_experts():
    """Llama 4: the k largest logits' sigmoids scale what goes into each expert (for a nonlinear
    expert that differs from scaling what comes out)."""
    gen = torch.Generator().manual_seed(2)
    x, logits = torch.randn(7, HIDDEN, generator=gen), torch.randn(7, NUM_EXPERTS, generator=gen)
    routing = sigmoid_top_k(logits, 2)
    assert torch.equal(routing.weights, torch.sigmoid(torch.topk(logits, 2).values))
    linear = Linear()

    def expert(e: int, rows: torch.Tensor) -> torch.Tensor:
        return torch.tanh(linear(e, rows))

    expected = torch.stack([
        sum(torch.tanh(w * x[t] @ linear.w[e]) for e, w in
            zip(routing.experts[t].tolist(), routing.weights[t], strict=True))
        for t in range(7)
    ])  # fmt: skip
    got = mixture(x, routing, expert, weights_inputs=True)
    assert torch.allclose(got, expected, atol=1e-5)
    assert not torch.allclose(mixture(x, routing, expert), expected, atol=1e-2)


def test_a_batch_without_rows_runs_no_expert():
    experts = Linear()
    routing = softmax_top_k(torch.zeros(0, NUM_EXPERTS), 2, is_normalized=True)
    assert mixture(torch.zeros(0, HIDDEN), routing, experts).shape == (0, HIDDEN)
    assert experts.calls == []
