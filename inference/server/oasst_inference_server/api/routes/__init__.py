"""One router per resource: the HTTP side of each use case.

May import ``api``'s other modules and every subpackage below ``api``.
"""
