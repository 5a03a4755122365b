"""The soak benchmark in one minute (benchmarks/soak.py; the README's run is 64 clients for 10):
16 clients against a real `ember serve`, a runner killed with SIGKILL halfway, a second model
loaded and unloaded; nothing lost, no error but on the killed runner, RSS flat."""

import importlib.util
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.model, pytest.mark.slow]

SOAK_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "soak.py"


def load_soak():
    spec = importlib.util.spec_from_file_location("soak", SOAK_PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["soak"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_sixteen_clients_for_a_minute_lose_nothing_and_survive_a_killed_runner(
    tmp_path,
    smollm2_path,
    gemma3_path,  # skip when a bundled model is missing
):
    soak = load_soak()
    settings = soak.Settings(clients=16, seconds=60, seed=1)
    report = soak.run_soak(settings, tmp_path)
    print(soak.summary(report, settings))
    assert report.failures == []
    counts = report.counts()
    assert counts["lost"] == 0 and counts["done"] > 0
    assert report.killed_pid is not None and report.new_runner_pid != report.killed_pid
