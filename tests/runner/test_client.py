"""RunnerClient without a model: what a request that still holds a closed client gets."""

import asyncio
import subprocess
import sys

import pytest

from ember.runner.client import RunnerClient, RunnerError, RunnerOutput


def test_a_closed_client_answers_the_dead_runners_error_not_a_runtime_error():
    # found by the soak: the scheduler closed a killed runner's client while requests held it
    async def test() -> None:
        process = subprocess.Popen([sys.executable, "-c", "pass"])
        process.wait()
        client = RunnerClient(process, 1)
        await client.close()
        with pytest.raises(RunnerError, match="the runner stopped") as err:
            [r async for r in client.completion("hi")]
        assert err.value.status == 500
        with pytest.raises(RunnerError, match="the runner stopped"):
            await client.tokenize("hi")

    asyncio.run(test())


def test_a_runners_output_goes_on_to_the_servers_stderr(capsys: pytest.CaptureFixture[str]):
    # as Ollama's server log holds its runners': a runner's traceback must not vanish
    process = subprocess.Popen(
        [sys.executable, "-c", "print('one'); print('two')"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    output = RunnerOutput(process.stdout)
    process.wait()
    assert output.tail(ended=True) == "two"
    assert "one\ntwo\n" in capsys.readouterr().err
