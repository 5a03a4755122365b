"""The `ember` command (typer, in app.py): serve, run (REPL), pull, push, create, list, show, ps,
stop, cp, rm, and the hidden `runner` the server starts for each model. Every command but serve
and runner talks to the server at EMBER_HOST."""

from ember.cli.app import main

__all__ = ["main"]
