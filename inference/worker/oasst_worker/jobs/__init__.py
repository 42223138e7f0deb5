"""Jobs (a generation or an embedding per server request) and the pool that runs them; imports backends, prompting, metrics."""
