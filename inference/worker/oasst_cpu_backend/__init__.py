"""The bundled CPU backend: a text-generation-inference compatible HTTP server over llama.cpp."""
