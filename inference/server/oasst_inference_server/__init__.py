"""The central inference server."""
