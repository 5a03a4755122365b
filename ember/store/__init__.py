"""The model store (manifests and content-addressed blobs, as Ollama lays them out), the
Modelfile, model creation and the registry client (pull/push)."""

from ember.store.create import CreateRequest, create_model
from ember.store.errors import (
    BlobDigestError,
    BlobSizeError,
    CreateError,
    InvalidDigestError,
    InvalidNameError,
    ManifestError,
    ModelfileError,
    RegistryError,
    StoreError,
)
from ember.store.manifest import Layer, Manifest
from ember.store.modelfile import Command, format_parameters, parse_modelfile, render_modelfile
from ember.store.models import ModelDetails, ModelEntry, StoredModel, get_model, list_models
from ember.store.names import Digest, ModelName
from ember.store.registry import Registry
from ember.store.store import Store

__all__ = [
    "BlobDigestError",
    "BlobSizeError",
    "Command",
    "CreateError",
    "CreateRequest",
    "Digest",
    "InvalidDigestError",
    "InvalidNameError",
    "Layer",
    "Manifest",
    "ManifestError",
    "ModelDetails",
    "ModelEntry",
    "ModelName",
    "ModelfileError",
    "Registry",
    "RegistryError",
    "Store",
    "StoreError",
    "StoredModel",
    "create_model",
    "format_parameters",
    "get_model",
    "list_models",
    "parse_modelfile",
    "render_modelfile",
]
