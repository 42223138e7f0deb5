"""HTTP: the routers (``routes/``), their dependencies, the documented error responses, the error handlers.

May import every other subpackage; only ``main`` imports it.
"""
