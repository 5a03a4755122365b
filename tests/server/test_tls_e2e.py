"""`ember serve` over HTTPS (EMBER_TLS_CERT / EMBER_TLS_KEY) with a certificate from a test CA
made here with `cryptography`: the real `ollama` and `openai` clients and the `ember` CLI talk
to it with SmolLM2, and /metrics is scraped from it (the real runner's KV cells and prefix
reuse). The misconfigurations are tests/cli/test_cli_tls.py's."""

import datetime
import ipaddress
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import ollama
import openai
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from prometheus_client.parser import text_string_to_metric_families
from serve_process import Server

from ember.catalog import ModelChecksumError, resolve_model
from ember.cli.app import main
from ember.errors import ModelNotFoundError

pytestmark = [pytest.mark.e2e, pytest.mark.model, pytest.mark.slow]

MODEL = "smollm2:135m"
NUM_CTX = 256
GREEDY = {"temperature": 0, "seed": 1, "num_predict": 3}


@dataclass(frozen=True)
class Certs:
    ca: Path  # the test CA's certificate: what clients trust
    cert: Path  # the server's, for 127.0.0.1 and localhost
    key: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _pem(path: Path, cert: x509.Certificate) -> Path:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path


def make_certs(folder: Path) -> Certs:
    """A CA and a server certificate it signed, valid for a day."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder(
            subject_name=_name("ember test CA"), issuer_name=_name("ember test CA")
        )
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )
    names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    server = (
        x509.CertificateBuilder(subject_name=_name("127.0.0.1"), issuer_name=ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
        .sign(ca_key, hashes.SHA256())
    )
    key_path = folder / "server.key"
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return Certs(_pem(folder / "ca.pem", ca), _pem(folder / "server.pem", server), key_path)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, certs: Certs) -> Iterator[Server]:
    try:
        resolve_model(MODEL)
    except ModelChecksumError:
        raise
    except ModelNotFoundError as err:
        pytest.skip(str(err))
    s = Server(
        tmp_path_factory.mktemp("tls"),
        ca=certs.ca,
        EMBER_TLS_CERT=str(certs.cert),
        EMBER_TLS_KEY=str(certs.key),
        EMBER_METRICS="1",
        EMBER_NUM_PARALLEL="2",
        # a small load: TLS and metrics are under test here, not speed (one thread also
        # keeps a shared, busy machine from slowing every step down many times over)
        EMBER_CONTEXT_LENGTH=str(NUM_CTX),
        EMBER_NUM_THREADS="1",
    )
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server: Server) -> Iterator[ollama.Client]:
    # closed before the server stops: an open keep-alive connection holds its shutdown
    with ollama.Client(host=server.url, verify=server.verify, timeout=120) as c:
        yield c


def test_the_ollama_and_openai_clients_over_https(server: Server, client: ollama.Client) -> None:
    version = httpx.get(f"{server.url}/api/version", verify=server.verify).json()
    assert version["version"].count(".") == 2
    assert client.list().models == []  # an empty store: the bundled models are not listed
    answer = client.generate(MODEL, "Say hi.", options=GREEDY)
    assert answer.done and answer.eval_count == GREEDY["num_predict"]
    (running,) = client.ps().models
    assert running.context_length == NUM_CTX
    oai = openai.OpenAI(
        base_url=f"{server.url}/v1",
        api_key="x",
        http_client=httpx.Client(verify=server.verify, timeout=120),
    )
    reply = oai.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Say hi."}],
        max_tokens=3,
        temperature=0,
    )
    assert reply.usage is not None and reply.usage.completion_tokens == 3
    assert MODEL in [m.id for m in oai.models.list()]
    oai.close()
    # a client that does not trust the test CA is refused; plain http gets no answer
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        httpx.get(f"{server.url}/api/version")
    with pytest.raises(httpx.TransportError):
        httpx.get(server.url.replace("https://", "http://") + "/api/version")


def test_metrics_of_a_real_server_over_https(server: Server, client: ollama.Client) -> None:
    prompt = "List three colours of the rainbow."
    for _ in range(2):  # the second reuses the first one's cached prompt
        client.generate(MODEL, prompt, options=GREEDY, raw=True)
    text = httpx.get(f"{server.url}/metrics", verify=server.verify).text
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }

    def value(name: str, **labels: str) -> float:
        return samples.get((name, tuple(sorted(labels.items()))), 0.0)

    assert value("ember_generated_tokens_total", model=MODEL) >= 2 * GREEDY["num_predict"]
    assert value("ember_prefix_cache_hit_tokens_total", model=MODEL) > 0
    assert value("ember_time_to_first_token_seconds_count", model=MODEL) >= 2
    assert value("ember_time_per_output_token_seconds_sum", model=MODEL) > 0
    assert value("ember_model_load_seconds_count", model=MODEL) == 1
    assert value("ember_slots", model=MODEL) == 2 and value("ember_loaded_models") == 1
    used, total = (
        value("ember_kv_cache_cells_used", model=MODEL),
        value("ember_kv_cache_cells", model=MODEL),
    )
    assert 0 < used < total == 2 * NUM_CTX
    route = {"route": "/api/generate", "method": "POST", "status": "200"}
    assert value("ember_requests_total", **route) >= 2


def test_ember_ps_over_https_trusts_ssl_cert_file(
    server: Server,
    client: ollama.Client,
    certs: Certs,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
) -> None:
    client.generate(MODEL, "", keep_alive="5m")
    monkeypatch.setenv("EMBER_HOST", server.url)
    monkeypatch.delenv("EMBER_API_KEY", raising=False)
    monkeypatch.setenv("SSL_CERT_FILE", str(certs.ca))
    assert main(["ps"]) == 0
    header, row = capsys.readouterr().out.splitlines()[:2]
    assert "SLOTS" in header and "KV CACHE" in header
    # the last two columns: Ember's own slots in use and KV cache type
    assert row.startswith(MODEL) and row.split()[-2:] == ["0/2", "f16"]
    monkeypatch.delenv("SSL_CERT_FILE")  # the default bundle: the test CA is not in it
    assert main(["ps"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("Error: ") and err.count("\n") == 1
    assert "is not trusted" in err and "SSL_CERT_FILE" in err
