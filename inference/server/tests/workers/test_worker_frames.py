"""Usage a worker reports is capped by what the server sent it and saw it stream (worker_frames)."""

from oasst_inference_server.workers.worker_frames import bounded_usage, utf8_size
from oasst_shared.protocol import GeneratedText


def test_utf8_size_counts_bytes_for_every_script():
    for text in ["", " ok", "é", "日本語", "🙂 hi", "a\u0301", "\x7f"]:
        assert utf8_size(text) == len(text.encode("utf-8")), text


def test_a_claim_is_capped_by_the_streamed_bytes_not_the_characters():
    # Three CJK characters are nine bytes: an honest worker may have needed up to nine tokens.
    streamed = sum(utf8_size(t) for t in ["日", "本", "語"])
    honest = GeneratedText(message_id="m", text="日本語", finish_reason="eos_token", generated_tokens=9)
    assert bounded_usage(honest, None, streamed).generated_tokens == 9
    forged = honest.model_copy(update={"generated_tokens": 10_000})
    capped = bounded_usage(forged, None, streamed).generated_tokens
    assert 9 <= capped < 100
