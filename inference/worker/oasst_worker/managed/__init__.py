"""Backends the worker starts itself: their command lines from a model config (``launch``), GPU groups and
supervision with restarts (``supervisor``), and switching the model they serve (``model_manager``).

May import the connection (to hand a dead backend's work back), the backends and the settings; only
``__main__`` imports it.
"""
