"""The HTTP server: Ollama's native API and OpenAI's /v1 over runner processes."""
