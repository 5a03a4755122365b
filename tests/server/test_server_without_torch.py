"""The server process (`ember serve`) never loads torch: its runners compute, each in a process
of its own, and torch's import alone is ~220 MB that the server held for nothing."""

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = """
import json, sys
from fastapi.testclient import TestClient
import ember.cli.serve
from ember.server.app import create_app

client = TestClient(create_app())
codes = [
    client.get("/api/tags").status_code,
    client.get("/api/version").status_code,
    client.post("/api/show", json={"model": "missing"}).status_code,
    client.post("/api/chat", json={"model": "missing", "messages": [], "format": 1}).status_code,
]
print(json.dumps({"codes": codes, "torch": "torch" in sys.modules}))
"""


def test_the_server_answers_without_importing_torch(tmp_path: Path) -> None:
    env = os.environ | {"EMBER_MODELS": str(tmp_path / "models"), "HOME": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["codes"][:2] == [200, 200] and all(c >= 400 for c in result["codes"][2:])
    assert not result["torch"]
