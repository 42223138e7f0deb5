"""The OpenAI-compatible wire format the server speaks (vLLM's ``protocol.py``): requests that convert
themselves to sampling parameters and conversations, the answers, chunks, model cards and errors, and the
shapes of the vLLM and Cohere extras (tokenize, rerank, score).

Only the server reads and writes these; a worker speaks the frames of :mod:`oasst_shared.protocol`. May
import oasst_shared and pydantic only: every layer of the server may import it.
"""
