"""A soak under load: N concurrent clients for T minutes against a real `ember serve`, with one
runner killed mid-run; every request's outcome is recorded and checked.

    .venv/bin/python benchmarks/soak.py --clients 64 --minutes 10

The server is started here (its own temporary model store, a free loopback port). The clients
send a mix of /api/generate, /api/chat (some with a JSON schema format), /api/embed, and OpenAI's
and Anthropic's routes (/v1/chat/completions, /v1/completions, /v1/responses, /v1/messages),
streaming and not, with small num_predict; some close their connection mid-request (cancelled);
a tenth ask for a second model, which is unloaded every 20 s (keep_alive 0), so the scheduler
loads it again while the first one runs. Partway through, the first model's runner process is
killed with SIGKILL.

Checks (exit status 1 when one fails): no request lost (each one completed, was refused with a
429/503 and an error body, or was cancelled by its client); no error except on the requests in
flight on the killed runner, each with an error message; no ERROR line in the server's log; the
server's RSS flat after warm-up (< 5% growth over the second half); the killed runner started
again and served a request.
`run_soak()` is the whole run as a function (the slow tests call it with small N and T).
"""

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

WORDS = [
    "river",
    "lantern",
    "copper",
    "meadow",
    "violin",
    "harbor",
    "quartz",
    "pepper",
    "saddle",
    "orbit",
    "tulip",
    "ember",
]
GRACE_S = 1.0  # a request sent this soon after the kill may still reach the dying runner
RSS_GROWTH_LIMIT = 0.05


@dataclass(frozen=True, slots=True)
class Settings:
    clients: int = 64
    seconds: float = 600.0
    model: str = "smollm2:135m"
    second_model: str = "gemma3:270m"  # "" for none
    kill_at: float = 0.5  # fraction of the run
    max_queue: int = 16  # EMBER_MAX_QUEUE: past 16 waiting requests, clients are refused
    seed: int = 0


@dataclass(slots=True)
class Outcome:
    """One request: what was sent and how it ended."""

    route: str
    model: str
    stream: bool
    start: float  # monotonic seconds
    end: float = 0.0
    status: int = 0  # HTTP status; 0: none came
    result: str = "lost"  # done | refused | cancelled | error | lost
    detail: str = ""  # the error message, or why it counts as lost


@dataclass
class Report:
    outcomes: list[Outcome]
    kill_time: float | None
    killed_pid: int | None
    new_runner_pid: int | None
    rss: list[tuple[float, int]]  # (seconds since start, server RSS bytes)
    log_errors: list[str]
    failures: list[str] = field(default_factory=list)

    def on_killed_runner(self, o: Outcome, main_model: str) -> bool:
        """Whether o was sent to the killed runner's model before the kill (or just after it)
        and still running when it came."""
        k = self.kill_time
        return k is not None and o.model == main_model and o.start <= k + GRACE_S and o.end >= k

    def counts(self) -> Counter[str]:
        return Counter(o.result for o in self.outcomes)

    def latencies(self) -> list[float]:
        return sorted(o.end - o.start for o in self.outcomes if o.result == "done")


# --- the server ---


class SoakServer:
    """`python -m ember serve` on a free port with a temporary model store."""

    def __init__(self, folder: Path, max_queue: int) -> None:
        from ember.runner.client import free_port

        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = folder / "server.log"
        env = {k: v for k, v in os.environ.items() if k != "EMBER_API_KEY"}
        env |= {
            "EMBER_HOST": f"127.0.0.1:{port}",
            "EMBER_MODELS": str(folder / "models"),
            "EMBER_CONTEXT_LENGTH": "2048",
            "EMBER_NUM_PARALLEL": "4",
            "EMBER_MAX_QUEUE": str(max_queue),
        }
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "ember", "serve"], env=env, stdout=log, stderr=log
            )
        self.psutil = psutil.Process(self.process.pid)

    def wait_ready(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"ember serve exited: see {self.log_path}")
            try:
                if httpx.get(self.url, timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.2)
        raise TimeoutError("ember serve did not answer")

    def rss(self) -> int:
        return int(self.psutil.memory_info().rss)

    def runner_pid(self, model_path: str) -> int | None:
        """The runner child that serves model_path, if one is running."""
        for child in self.psutil.children():
            try:
                args = child.cmdline()
            except psutil.Error:
                continue
            if "runner" in args and model_path in args and child.status() != "zombie":
                return int(child.pid)
        return None

    def log_errors(self) -> list[str]:
        """The ERROR lines of the server log (a failed request logs its exception there)."""
        lines = self.log_path.read_text(errors="replace").splitlines()
        return [line for line in lines if "level=ERROR" in line or "Traceback" in line]

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


# --- one request ---


def _prompt(rng: random.Random) -> str:
    return "Write one sentence about " + " and ".join(rng.sample(WORDS, rng.randint(1, 3))) + "."


ROUTES = [
    "/api/generate",
    "/api/chat",
    "/api/embed",
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/messages",
    "/v1/responses",
]
PERSON = {  # a structured output: the grammar path under load
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}


def _request(rng: random.Random, model: str) -> tuple[str, dict[str, Any]]:
    """A random route and body of the mix."""
    route = rng.choice(ROUTES)
    prompt, num_predict, stream = _prompt(rng), rng.randint(2, 12), rng.random() < 0.5
    messages = [{"role": "user", "content": prompt}]
    options: dict[str, Any] = {"num_predict": num_predict}
    if route == "/api/generate":
        body = {"prompt": prompt, "stream": stream, "options": options}
    elif route == "/api/chat":
        body = {"messages": messages, "stream": stream, "options": options}
        if rng.random() < 0.3:
            body["format"] = PERSON
    elif route == "/api/embed":
        body = {"input": [prompt] * rng.randint(1, 3)}
    elif route == "/v1/completions":
        body = {"prompt": prompt, "stream": stream, "max_tokens": num_predict}
    elif route == "/v1/responses":
        body = {"input": prompt, "stream": stream, "max_output_tokens": num_predict}
    else:  # OpenAI's chat and Anthropic's messages
        body = {"messages": messages, "stream": stream, "max_tokens": num_predict}
    return route, {"model": model, **body}


ENDS = ("message_stop", "response.completed", "response.incomplete")  # max tokens: incomplete


async def _read_stream(response: httpx.Response, stop_after: int | None) -> str:
    """Reads a stream to its end: "" when it ended well, else why not; stops (cancelled) after
    stop_after pieces. NDJSON ends with a done record, OpenAI's SSE with [DONE], Anthropic's
    and the Responses API's with an event of ENDS."""
    pieces = 0
    async for line in response.aiter_lines():
        if not line or line.startswith("event: "):
            continue
        if line == "data: [DONE]":
            return ""
        record = json.loads(line.removeprefix("data: "))
        error = record.get("error")
        if error or record.get("type") in ("error", "response.failed"):
            error = error or record.get("response", {}).get("error")
            return "error: " + str(error.get("message") if isinstance(error, dict) else error)
        if record.get("done") or record.get("type") in ENDS:
            return ""
        pieces += 1
        if stop_after is not None and pieces >= stop_after:
            return "cancelled"
    return "lost: the stream ended without its last record"


async def _send(
    http: httpx.AsyncClient, outcome: Outcome, body: dict[str, Any], stop_after: int | None
) -> None:
    async with http.stream("POST", outcome.route, json=body) as response:
        outcome.status = response.status_code
        if response.status_code != 200:
            text = (await response.aread()).decode(errors="replace")
            _classify_refusal(outcome, text)
            return
        if not body.get("stream"):
            data = json.loads(await response.aread())
            answers = ("response", "message", "embeddings", "choices", "content", "output")
            ok = any(k in data for k in answers)
            outcome.result, outcome.detail = ("done", "") if ok else ("lost", "no answer field")
            return
        ended = await _read_stream(response, stop_after)
        if ended in ("", "cancelled"):
            outcome.result = ended or "done"
        else:
            outcome.result, _, outcome.detail = ended.partition(": ")


def _classify_refusal(outcome: Outcome, text: str) -> None:
    try:
        error = json.loads(text).get("error")
    except (ValueError, AttributeError):
        error = None
    message = error.get("message") if isinstance(error, dict) else error
    if not message:
        outcome.result, outcome.detail = "lost", f"HTTP {outcome.status} without an error: {text}"
    elif outcome.status in (429, 503):
        outcome.result, outcome.detail = "refused", str(message)
    else:
        outcome.result, outcome.detail = "error", str(message)


async def one_request(http: httpx.AsyncClient, rng: random.Random, model: str) -> Outcome:
    route, body = _request(rng, model)
    outcome = Outcome(route, model, bool(body.get("stream")), time.monotonic())
    cancel = rng.random() < 0.1  # a client that goes away mid-request
    try:
        if cancel and not body.get("stream"):
            timeout = rng.uniform(0.05, 2.0)
            await asyncio.wait_for(_send(http, outcome, body, None), timeout)
        else:
            await _send(http, outcome, body, rng.randint(1, 3) if cancel else None)
    except TimeoutError:
        outcome.result = "cancelled"
    except (httpx.HTTPError, ValueError) as err:
        outcome.result, outcome.detail = "lost", f"{type(err).__name__}: {err}"
    outcome.end = time.monotonic()
    return outcome


# --- the run ---


async def _client(url: str, settings: Settings, index: int, deadline: float) -> list[Outcome]:
    rng = random.Random(settings.seed * 1000 + index)
    outcomes = []
    # a request waits in the queue as long as the server is slow: only no answer at all is lost
    timeout = httpx.Timeout(max(600.0, settings.seconds), connect=30)
    async with httpx.AsyncClient(base_url=url, timeout=timeout) as http:
        while time.monotonic() < deadline:
            second = settings.second_model and rng.random() < 0.1
            model = settings.second_model if second else settings.model
            outcome = await one_request(http, rng, model)
            outcomes.append(outcome)
            if outcome.result == "refused":  # as a polite client: back off a little
                await asyncio.sleep(rng.uniform(1.0, 3.0))
    return outcomes


async def _unload_second(url: str, settings: Settings, deadline: float) -> None:
    """Every 20 s the second model is unloaded (keep_alive 0), so the next request loads it."""
    async with httpx.AsyncClient(base_url=url, timeout=600) as http:
        while time.monotonic() + 20 < deadline:
            await asyncio.sleep(20)
            body = {"model": settings.second_model, "keep_alive": 0}
            with contextlib.suppress(httpx.HTTPError):  # the clients' outcomes are what count
                await http.post("/api/generate", json=body)


async def _sample_rss(server: SoakServer, start: float, deadline: float, into: list) -> None:
    while time.monotonic() < deadline:
        into.append((time.monotonic() - start, server.rss()))
        await asyncio.sleep(2.0)


async def _kill_runner(server: SoakServer, model_path: str, at: float) -> tuple[float, int] | None:
    await asyncio.sleep(max(0.0, at - time.monotonic()))
    pid = server.runner_pid(model_path)
    if pid is None:
        return None
    os.kill(pid, signal.SIGKILL)
    return time.monotonic(), pid


async def _run(server: SoakServer, settings: Settings, model_path: str) -> Report:
    start = time.monotonic()
    deadline = start + settings.seconds
    rss: list[tuple[float, int]] = []
    jobs = [_client(server.url, settings, i, deadline) for i in range(settings.clients)]
    extra = [_sample_rss(server, start, deadline, rss)]
    if settings.second_model:
        extra.append(_unload_second(server.url, settings, deadline))
    killer = asyncio.ensure_future(
        _kill_runner(server, model_path, start + settings.seconds * settings.kill_at)
    )
    results = await asyncio.gather(*jobs, *extra)
    killed = await killer
    outcomes = [o for per_client in results[: settings.clients] for o in per_client]
    return Report(
        outcomes=outcomes,
        kill_time=killed[0] if killed else None,
        killed_pid=killed[1] if killed else None,
        new_runner_pid=server.runner_pid(model_path),
        rss=rss,
        log_errors=server.log_errors(),
    )


def _warm_up(server: SoakServer, settings: Settings) -> None:
    """Loads the models once, so the first clients do not all time the load."""
    for model in filter(None, (settings.model, settings.second_model)):
        body = {"model": model, "prompt": "Hi", "stream": False, "options": {"num_predict": 1}}
        response = httpx.post(f"{server.url}/api/generate", json=body, timeout=600)
        response.raise_for_status()


def run_soak(settings: Settings, folder: Path | None = None) -> Report:
    """The whole soak: start a server, run the clients, stop it, check the outcomes."""
    from ember.catalog import resolve_model

    model_path = str(resolve_model(settings.model))
    with tempfile.TemporaryDirectory(prefix="ember-soak-") as tmp:
        server = SoakServer(folder or Path(tmp), settings.max_queue)
        try:
            server.wait_ready()
            _warm_up(server, settings)
            report = asyncio.run(_run(server, settings, model_path))
        finally:
            server.stop()
    check(report, settings)
    return report


# --- the checks and the summary ---


def rss_growth(rss: list[tuple[float, int]]) -> float:
    """The growth of RSS over the second half: the median of the last five samples against
    the median of the five at the half (single samples jump with the allocator)."""
    half = [value for t, value in rss if t >= rss[-1][0] / 2]
    if len(half) < 2:
        return 0.0
    first, last = statistics.median(half[:5]), statistics.median(half[-5:])
    return (last - first) / first


def check(report: Report, settings: Settings) -> None:
    """Fills report.failures with every check that failed."""
    failures = report.failures
    lost = [o for o in report.outcomes if o.result == "lost"]
    failures += [f"lost: {o.route} {o.model} stream={o.stream}: {o.detail}" for o in lost[:10]]
    for o in report.outcomes:
        if o.result != "error":
            continue
        if not report.on_killed_runner(o, settings.model):
            failures.append(f"error not on the killed runner: {o.route} {o.status}: {o.detail}")
        elif not o.detail:
            failures.append(f"error without a message: {o.route} {o.status}")
    if report.killed_pid is None:
        failures.append("no runner to kill was found")
    elif report.new_runner_pid in (None, report.killed_pid):
        failures.append("the killed runner was not started again")
    elif not _served_after_kill(report, settings.model):
        failures.append("no request to the killed runner's model completed after the kill")
    growth = rss_growth(report.rss)
    if growth >= RSS_GROWTH_LIMIT:
        failures.append(f"server RSS grew {growth:.1%} over the second half")
    failures += [f"server log: {line}" for line in report.log_errors[:5]]
    if not report.counts()["done"]:
        failures.append("no request completed")


def _served_after_kill(report: Report, model: str) -> bool:
    """Whether a request to the model completed after the kill: only a new runner could."""
    after = report.kill_time or 0
    return any(o.result == "done" and o.model == model and o.end > after for o in report.outcomes)


def summary(report: Report, settings: Settings) -> str:
    counts = report.counts()
    latencies = report.latencies()
    p50 = statistics.median(latencies) if latencies else 0.0
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] if latencies else 0.0
    killed = sum(o.result == "error" for o in report.outcomes)
    routes = Counter(o.route for o in report.outcomes if o.result == "done")
    rss0, rss1 = report.rss[0][1] if report.rss else 0, report.rss[-1][1] if report.rss else 0
    lines = [
        f"soak: {settings.clients} clients for {settings.seconds:.0f} s, {settings.model}"
        + (f" + {settings.second_model}" if settings.second_model else ""),
        f"requests: {len(report.outcomes)}  done: {counts['done']}  refused: {counts['refused']}"
        f"  cancelled: {counts['cancelled']}  errors on the killed runner: {killed}"
        f"  lost: {counts['lost']}",
        "done by route: " + ", ".join(f"{r} {n}" for r, n in sorted(routes.items())),
        f"latency of completed requests: p50 {p50:.2f} s  p99 {p99:.2f} s",
        f"server RSS: start {rss0 / 2**20:.0f} MiB  end {rss1 / 2**20:.0f} MiB"
        f"  growth over the second half {rss_growth(report.rss):+.1%}",
        f"runner killed: pid {report.killed_pid}, restarted as pid {report.new_runner_pid}",
        f"errors in the server log: {len(report.log_errors)}",
    ]
    lines += [f"FAILED: {f}" for f in report.failures] or ["all checks passed"]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--model", default="smollm2:135m")
    parser.add_argument("--second-model", default="gemma3:270m", help='"" for none')
    parser.add_argument("--max-queue", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", type=Path, help="a folder for the model store and server log")
    args = parser.parse_args()
    settings = Settings(
        clients=args.clients,
        seconds=args.minutes * 60,
        model=args.model,
        second_model=args.second_model,
        max_queue=args.max_queue,
        seed=args.seed,
    )
    report = run_soak(settings, args.keep)
    print(summary(report, settings))
    return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main())
