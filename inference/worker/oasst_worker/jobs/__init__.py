"""Jobs: one unit of server work (a generation or an embedding) run against a backend; may import backends,
prompting, metrics and oasst_shared."""
