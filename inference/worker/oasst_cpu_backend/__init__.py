"""The bundled CPU backend: a TGI-compatible HTTP server over llama.cpp; imports oasst_shared, never the worker or the server."""
