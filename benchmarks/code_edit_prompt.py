"""The code-editing prompt of the speculative decoding test and benchmark: the answer repeats
most of the prompt, which is what prompt lookup drafts from."""

FUNCTION = '''def summarize(values, threshold):
    """Counts, sums and averages the values above threshold."""
    x = 0
    total = 0.0
    largest = None
    smallest = None
    for value in values:
        if value <= threshold:
            continue
        x += 1
        total += value
        if largest is None or value > largest:
            largest = value
        if smallest is None or value < smallest:
            smallest = value
    if x == 0:
        return {"count": 0, "total": 0.0, "mean": None}
    mean = total / x
    spread = largest - smallest
    report = {
        "count": x,
        "total": total,
        "mean": mean,
        "largest": largest,
        "smallest": smallest,
        "spread": spread,
    }
    if x > 100:
        report["note"] = "many values"
    return report
'''

CODE_EDIT_PROMPT = (
    "Rename the variable x to count in this function. Answer with the whole function only.\n\n"
    f"```python\n{FUNCTION}```"
)
