"""The inference worker: relays the server's jobs to a text-generation backend; imports oasst_shared, never a server package."""
