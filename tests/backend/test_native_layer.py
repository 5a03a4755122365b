"""The native decoder layer (backend/native/layer.h) against the Python layers it replaces: the
same logits to float32 rounding for decode steps and small batches of several sequences, on
every ISA path this CPU runs, over f32, f16 and bf16 caches; a cache it cannot read (q8_0)
leaves the step to the Python layers."""

import gc
import weakref

import pytest
import torch
from tinymodels import write_tiny_gguf

from ember.backend import native
from ember.backend.layer import NativeLayer
from ember.batch import Batch
from ember.gguf import GGUFFile
from ember.model import forward, load_model
from ember.nn.native_layers import run_native

pytestmark = pytest.mark.skipif(not native.available(), reason="no native library")

SIZES = {"hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 4, "head_dim": 64}
# each arch in a type whose kernels differ: 32-element blocks, K blocks, a mix (gemma3's
# Q4_K_M-like file: Q5_0 q/k/v, Q8_0 v, Q6_K down)
CASES = {
    "llama": ("Q4_1", {}),
    "qwen2": ("Q4_K", {}),
    "gemma3": ("Q5_0", {"*attn_v*": "Q8_0", "*ffn_down*": "Q6_K"}),
}
PROMPT = [(5 * i + 2) % 150 + 5 for i in range(20)]
# of max |logit|: the layers round differently by an ulp here and there (sums in another
# order), which a half-size cache's rounding of a key can turn into one of its own ulps, and a
# q8_K code into its neighbour (qwen2's f32 case: 0.96e-4 of its logits, 1.1e-4 once the
# Python layers' activation became the native one)
TOLERANCE = {"f32": 2e-4, "f16": 1e-3, "bf16": 1e-2}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("native_layer")
    out = {}
    for arch, (ggml_type, types) in CASES.items():
        out[arch] = root / f"{arch}.gguf"
        write_tiny_gguf(arch, out[arch], ggml_type=ggml_type, tensor_types=types, **SIZES)
    return out


def load(path, isa, monkeypatch, *, passes: int | None = 2):
    """The model on `isa`; passes: every K-type weight's q8_K passes (None: the defaults, one
    pass where the input has no outliers). With one int8 pass an ulp's difference in a norm
    (the two layers sum in other orders) can move a code to its neighbour, so the layers are
    compared with two."""
    monkeypatch.setenv("EMBER_CPU_ISA", isa)
    if passes is not None:
        monkeypatch.setattr("ember.model.weights.activation_passes", lambda name: passes)
    return load_model(GGUFFile.open(path))


def decode(model, *, native_on: bool, kv: str, tokens=None) -> list[torch.Tensor]:
    """Logits of the prompt's prefill (Python: 20 tokens), 4 greedy steps, then one batch of
    three tokens: the next step of sequence 0 and two tokens of a new sequence 1 (a mask).
    tokens: the 5 tokens to feed instead of each step's argmax (to compare near-ties)."""
    model._native = model.native_layers() if native_on else None
    cache = model.make_cache()
    cache.init(max_sequences=2, capacity=64, max_batch=32, dtype=kv)
    out = [forward(model, cache, Batch.single(PROMPT, 0))[0]]
    token = int(out[-1].argmax()) if tokens is None else tokens[0]
    for step in range(4):
        out.append(forward(model, cache, Batch.single([token], len(PROMPT) + step))[0])
        token = int(out[-1].argmax()) if tokens is None else tokens[step + 1]
    pos = len(PROMPT) + 4
    batch = Batch((token, 9, 11), (pos, 0, 1), (0, 1, 1), (0, 1, 2))
    out.extend(forward(model, cache, batch))
    return out


ISAS = native.runnable_isas() if native.available() else []


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("kv", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("arch", list(CASES))
def test_native_layers_equal_the_python_layers(files, arch, kv, isa, monkeypatch):
    model = load(files[arch], isa, monkeypatch)
    assert model.native_layers() is not None, f"{arch} binds no native layers on {isa}"
    calls = []
    original = NativeLayer.__call__
    monkeypatch.setattr(NativeLayer, "__call__", lambda s, *a: calls.append(1) or original(s, *a))
    ours = decode(model, native_on=True, kv=kv)
    assert len(calls) == 5 * len(model.blocks)  # 4 steps and the batch, every layer
    theirs = decode(model, native_on=False, kv=kv)
    for a, b in zip(ours, theirs, strict=True):
        assert (a - b).abs().max() <= TOLERANCE[kv] * b.abs().max()


@pytest.mark.parametrize("isa", ISAS)
def test_one_activation_pass_stays_close(files, isa, monkeypatch):
    # qwen2's Q4_K q/k/v and gate/up take one q8_K pass by default (attn_output and down two),
    # in the 20-token prefill too; both runs are fed the same tokens (random weights have
    # near-ties that 1% moves)
    one_pass = load(files["qwen2"], isa, monkeypatch, passes=None)  # before load() patches
    twos = decode(load(files["qwen2"], isa, monkeypatch), native_on=True, kv="f32")
    tokens = [int(t.argmax()) for t in twos[:5]]
    ones = decode(one_pass, native_on=True, kv="f32", tokens=tokens)
    gaps = [float((a - b).abs().max() / b.abs().max()) for a, b in zip(ones, twos, strict=True)]
    assert max(gaps) <= 3e-2  # ~1.3% seen
    # every step's q8_K passes show (the prompt's too: its logits are the head's one row; and
    # the lane kernels', which take q8_K's codes), but not where the amx path's rows of x take
    # vnni.h's int16 codes (Q4_K from one row)
    passes = 0 if isa == "amx" else len(gaps)  # the prompt, 4 one-row steps, the batch's 3 rows
    assert all(gaps[:passes]) and not any(gaps[passes:]), gaps


def test_a_quantized_cache_takes_the_python_layers(files, monkeypatch):
    model = load(files["llama"], native.runnable_isas()[0], monkeypatch)
    calls = []
    monkeypatch.setattr(NativeLayer, "__call__", lambda *a: calls.append(1))
    decode(model, native_on=True, kv="q8_0")
    assert not calls


def test_a_new_cache_rebinds_the_layers_and_an_old_one_is_freed(files, monkeypatch):
    # the layers remember the cache tensors they point into (weakly): the same model's next
    # cache, of another float type, must be read where it is, as it is; an old one must not
    # stay alive
    model = load(files["llama"], native.runnable_isas()[0], monkeypatch)
    layers = model.native_layers()
    assert layers is not None
    ours = {kv: decode(model, native_on=True, kv=kv) for kv in ("f16", "f32", "bf16")}
    assert model.native_layers() is layers  # the same layers took the three caches in turn
    cache = model.make_cache()
    cache.init(max_sequences=1, capacity=64, max_batch=32, dtype="f32")
    forward(model, cache, Batch.single(PROMPT[:3], 0))
    forward(model, cache, Batch.single([7], 3))  # a native step: the layers bind this cache
    keys = weakref.ref(cache.stores[0].k)
    del cache
    gc.collect()
    assert keys() is None
    for kv, logits in ours.items():
        theirs = decode(model, native_on=False, kv=kv)
        for a, b in zip(logits, theirs, strict=True):
            assert (a - b).abs().max() <= TOLERANCE[kv] * b.abs().max()


def test_rope_tables_made_for_each_layer_give_the_same_step(files, monkeypatch):
    # run_native reads each table's addresses once a step, keyed by the tables' id (and keeps
    # them alive, so that no id is reused): tables made afresh for each layer give the step
    # the shared ones give
    model = load(files["llama"], native.runnable_isas()[0], monkeypatch)
    cache = model.make_cache()
    cache.init(max_sequences=1, capacity=64, max_batch=32, dtype="f32")
    forward(model, cache, Batch.single(PROMPT, 0))
    batch = Batch.single([7], len(PROMPT))
    cache.start_forward(batch)
    x = model.token_embd.lookup(torch.tensor(batch.tokens))
    shared = model.native_rope(batch)
    fresh = lambda i: (shared[0].clone(), shared[1].clone())  # noqa: E731
    with torch.inference_mode():
        once = run_native(model.native_layers(), x, cache, lambda i: shared)
        again = run_native(model.native_layers(), x, cache, fresh)  # the same cells rewritten
    assert once is not None and again is not None
    assert torch.equal(once, again)
