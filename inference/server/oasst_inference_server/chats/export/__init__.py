"""The dataset export: the chats of users who allow data use, with their votes, reports and evaluations,
as Open-Assistant message trees (``oasst_shared.export_format``), one JSON line per chat.

``selection`` says which chats, ``reading`` reads them from the database a bounded batch at a time,
``trees`` shapes one chat into a tree, ``lines`` streams the lines, ``files`` writes them for the admin
CLI. May import db, settings, domain_errors and oasst_shared, as the rest of ``chats``.
"""

from oasst_inference_server.chats.export.lines import DEFAULT_BATCH_CHATS, export_lines
from oasst_inference_server.chats.export.selection import ExportSelection

__all__ = ["DEFAULT_BATCH_CHATS", "ExportSelection", "export_lines"]
