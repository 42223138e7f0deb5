"""The one error that ends the worker instead of a connection."""


class FatalWorkerError(Exception):
    """Reconnecting cannot help (bad API key, incompatible protocol, a backend that can never load): the
    operator must act."""
