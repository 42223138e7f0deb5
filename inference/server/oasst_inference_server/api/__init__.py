"""HTTP: the routers (``routes/``), their dependencies, the documented error responses, the error handlers,
and the edge's guards: the outermost middleware (``edge_guard``) and the HTTP protocol below it
(``connection_guard``).

May import every other subpackage; only ``main`` and ``serve`` import it.
"""
