"""Model aliases and fallbacks: which model config serves a request for a name.

``alias_store`` keeps the aliases the operator sets (the database is their truth); ``alias_table`` is each
replica's view of them, read again at once when any replica announces a change through the broker;
``router`` turns a requested name into the config that serves it (the alias's config, else the first
fallback with a worker and queue room); ``alias_admin`` checks and applies the admin API's and CLI's
changes.

May import scheduling, db, broker, events, settings, domain_errors and oasst_shared; not api, openai_api,
submission or admission.
"""
