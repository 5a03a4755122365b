"""Numbers as Ollama's format package writes them for people; no heavy imports, so the CLI
and the store share them."""


def human_number(n: float) -> str:
    """Ollama's format.HumanNumber: 135M, 1.5B, 494.03M, 12K."""
    n = int(n)
    for unit, scale in (("B", 10**9), ("M", 10**6)):
        if n >= scale:
            value = n / scale
            if value == int(value):
                return f"{value:.0f}{unit}"
            return f"{value:.1f}{unit}" if unit == "B" else f"{value:.2f}{unit}"
    return f"{n / 1000:.0f}K" if n >= 1000 else str(n)
