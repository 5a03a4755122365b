"""The Modelfile's DRAFT: kept in the model's config, inherited by a derived model, written back."""

from pathlib import Path

from test_store_create import store, tiny_gguf, upload  # noqa: F401 (fixtures)

from ember.store import CreateRequest, Store, create_model, get_model, parse_modelfile
from ember.store.modelfile import render_modelfile


def test_draft_is_stored_inherited_and_written_back(store: Store, tiny_gguf: Path) -> None:  # noqa: F811
    digest = upload(store, tiny_gguf)
    commands = parse_modelfile("FROM ./tiny.gguf\nDRAFT smollm2:135m\n")
    request = CreateRequest.from_modelfile(commands, files={"tiny.gguf": digest})
    assert request.draft == "smollm2:135m"
    list(create_model(store, "with-draft", request))
    list(create_model(store, "derived", CreateRequest(from_="with-draft")))
    for name in ("with-draft", "derived"):
        model = get_model(store, name)
        assert model.config["draft"] == "smollm2:135m"
        assert "DRAFT smollm2:135m\n" in render_modelfile(model)
