"""The OpenAI-compatible API (``/v1`` and vLLM's extras): one serving object per endpoint (vLLM's
``serving_*.py`` shape: ``ChatCompletionServing.create``, ``CompletionServing``, ``EmbeddingServing``,
``ModelServing``, ``ScoringServing``, ``TokenizeServing``), each route one call into its own; beneath them
the service that queues and follows API requests, and answers and streams in OpenAI's shapes. The wire
models are :mod:`oasst_inference_server.openai_protocol`.

May import submission, admission, streams, chats, dispatch, auth, db, broker, metrics, settings,
openai_protocol; not api, errors or FastAPI.
"""
