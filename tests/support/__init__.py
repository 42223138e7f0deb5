"""Helpers of the tests and the benchmarks (fixtures stay in the conftest.py files, which import these):

- ``processes``: free ports, starting a process with its output in a log file, waiting until it answers
- ``services``: throwaway Postgres databases and Redis key prefixes on the local servers
- ``stacks``: the bundled CPU backend, a server with its workers, server replicas sharing a database
- ``fake_backend`` (a script) and ``fake_workers``: the scripted backend for fault injection, and workers
  in front of it
- ``llama_server``: llama-cpp-python's own OpenAI-compatible server, and a stack whose workers relay to it
- ``api``, ``fake_oauth``: the REST API tests' users and constants, and a fake OAuth provider
- ``sessions``: worker session records as a connected worker would publish them
- ``worker_jobs``: a worker's jobs run in process (a one-token backend, a frame recorder)
"""
