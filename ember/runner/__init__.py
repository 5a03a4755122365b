"""The runner: sequences, stop sequences and streaming (the multi-sequence loop comes here too)."""
