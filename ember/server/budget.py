"""A thinking budget: the model thinks for at most N tokens, then answers (Anthropic's
`thinking.budget_tokens`). Runner records in, runner records out; parsing stays the caller's.

The first completion may generate N tokens. If it stops there with its thinking still open, a
second one continues from the prompt + that thinking + the closing tag (the runner reuses the
cached prefix), with what is left of num_predict; its records follow the first's, after a closing
tag piece that ends the thinking for the output parser. The runner counts the tokens, so the
budget is exact. Answering within the budget costs one continuation when the answer is longer
than what is left of the N tokens."""

import contextlib
from collections.abc import AsyncGenerator, Callable
from typing import Any

from ember.server.thinking import ThinkingTags

Record = dict[str, Any]
Complete = Callable[
    [str, dict[str, Any]], AsyncGenerator[Record, None]
]  # (prompt, fields) -> records


async def capped(
    complete: Complete, prompt: str, fields: dict[str, Any], *, budget: int, tags: ThinkingTags
) -> AsyncGenerator[Record, None]:
    """complete(prompt, fields)'s records, with at most `budget` tokens of thinking."""
    limit = fields["options"]["num_predict"]  # 0 or less: no limit (as Ollama)
    if 0 < limit <= budget:  # the whole answer fits in the budget
        async with contextlib.aclosing(complete(prompt, fields)) as records:
            async for record in records:
                yield record
        return
    pieces: list[str] = []
    first: Record = {}
    async with contextlib.aclosing(complete(prompt, _predicting(fields, budget))) as records:
        async for record in records:
            if record.get("done"):
                first = record
                break
            pieces.append(record.get("content", ""))
            yield record
    if first.get("done_reason") != "length" or first.get("eval_count", 0) < budget:
        yield first  # it ended by itself (or the context ended it)
        return
    output = "".join(pieces)
    closing = tags.closing if is_thinking(tags, prompt, output) else ""
    if closing:
        yield {"content": closing}
    rest = limit - budget if limit > 0 else limit
    second = complete(prompt + output + closing, _predicting(fields, rest))
    async with contextlib.aclosing(second) as records:
        async for record in records:
            yield _merged(first, record) if record.get("done") else record


def is_thinking(tags: ThinkingTags, prompt: str, output: str) -> bool:
    """Whether output (the answer so far to prompt) is inside an unclosed thinking section."""
    opened = prompt.rstrip().endswith(tags.opening) or output.lstrip().startswith(tags.opening)
    return opened and tags.closing not in output


def _predicting(fields: dict[str, Any], num_predict: int) -> dict[str, Any]:
    return {**fields, "options": {**fields["options"], "num_predict": num_predict}}


def _merged(first: Record, second: Record) -> Record:
    """The final record of both completions: the first's prompt, the tokens of both."""
    summed = ("prompt_eval_count", "prompt_eval_duration", "eval_count", "eval_duration")
    merged = {**second, **{k: first.get(k, 0) + second.get(k, 0) for k in summed}}
    merged["prompt_count"] = first.get("prompt_count", first.get("prompt_eval_count", 0))
    return merged
