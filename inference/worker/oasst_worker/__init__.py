"""The inference worker: connects to the server and relays jobs to a text-generation backend."""
