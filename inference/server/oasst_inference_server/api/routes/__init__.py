"""One router per resource: the HTTP side of each use case (parse, call a service, shape the response;
no SQL here: the queries live in the service that owns the data).

May import ``api``'s other modules and every subpackage below ``api``.
"""
