"""RunnerClient without a model: what a request that still holds a closed client gets."""

import asyncio
import subprocess
import sys
import tempfile

import pytest

from ember.runner.client import RunnerClient, RunnerError


def test_a_closed_client_answers_the_dead_runners_error_not_a_runtime_error():
    # found by the soak: the scheduler closed a killed runner's client while requests held it
    async def test() -> None:
        process = subprocess.Popen([sys.executable, "-c", "pass"])
        process.wait()
        client = RunnerClient(process, 1, tempfile.TemporaryFile())  # noqa: SIM115 (close() does)
        await client.close()
        with pytest.raises(RunnerError, match="the runner stopped") as err:
            [r async for r in client.completion("hi")]
        assert err.value.status == 500
        with pytest.raises(RunnerError, match="the runner stopped"):
            await client.tokenize("hi")

    asyncio.run(test())
