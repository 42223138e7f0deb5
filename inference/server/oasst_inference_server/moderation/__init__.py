"""The moderation hook (off by default; docs/operating.md#moderation): the checks, a word list (`word_list`)
and a classifier served by an embedding worker (`classifier`), the action they lead to and the flags they
leave (`hook`, `flags`), and the watch of an answer as it streams (`answer_watch`).

May import db, settings, domain_errors, settings_sections; the workers' connections, submission and the
OpenAI API use it.
"""
