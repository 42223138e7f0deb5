from __future__ import annotations

import pytest

from oasst_text_client.sse import LineSplitter, ServerSentEvent, SSEDecoder, iter_sse


def decode_all(lines: list[str]) -> list[ServerSentEvent]:
    decoder = SSEDecoder()
    return [e for e in (decoder.decode(line) for line in lines) if e is not None]


class TestLineSplitter:
    @pytest.mark.parametrize("newline", ["\n", "\r", "\r\n"])
    def test_each_line_break(self, newline: str) -> None:
        assert LineSplitter().feed(f"a{newline}b{newline}{newline}c") == ["a", "b", ""]

    def test_crlf_split_across_chunks_is_one_break(self) -> None:
        splitter = LineSplitter()
        assert splitter.feed("a\r") == ["a"]
        assert splitter.feed("\nb\n") == ["b"]

    def test_cr_then_cr_is_two_breaks(self) -> None:
        splitter = LineSplitter()
        assert splitter.feed("a\r") == ["a"]
        assert splitter.feed("\rb\n") == ["", "b"]

    def test_partial_line_is_kept_until_its_break(self) -> None:
        splitter = LineSplitter()
        assert splitter.feed("da") == []
        assert splitter.feed("ta: x") == []
        assert splitter.feed("\n") == ["data: x"]
        assert splitter.flush() == []

    def test_unicode_line_separators_do_not_split(self) -> None:
        # str.splitlines would cut at these; in SSE only CR and LF end a line.
        text = "data: a\u2028b\u0085c\x0bd\x1ce\n"
        assert LineSplitter().feed(text) == ["data: a\u2028b\u0085c\x0bd\x1ce"]

    def test_flush_returns_unterminated_rest(self) -> None:
        splitter = LineSplitter()
        splitter.feed("a\nrest")
        assert splitter.flush() == ["rest"]
        assert splitter.flush() == []


class TestDecoder:
    def test_id_and_data(self) -> None:
        [event] = decode_all(["id: 5-0", 'data: {"x": 1}', ""])
        assert event == ServerSentEvent(data='{"x": 1}', event="message", id="5-0")

    def test_multi_line_data_is_joined_with_newlines(self) -> None:
        [event] = decode_all(["data: first", "data:second", "data:  third", "data", ""])
        # One leading space is stripped, no more; a bare "data" field appends an empty line.
        assert event.data == "first\nsecond\n third\n"

    def test_comments_are_ignored(self) -> None:
        events = decode_all([": ping", "", ":", "id: 1", ": another", "data: x", ""])
        assert [e.data for e in events] == ["x"]
        assert events[0].id == "1"

    def test_comment_only_stream_yields_nothing(self) -> None:
        assert decode_all([": ping - 2024-01-01 00:00:00", "", ": ping", ""]) == []

    def test_event_type_resets_after_each_event(self) -> None:
        events = decode_all(["event: token", "data: a", "", "data: b", ""])
        assert [(e.event, e.data) for e in events] == [("token", "a"), ("message", "b")]

    def test_last_event_id_persists_until_changed(self) -> None:
        events = decode_all(["id: 1", "data: a", "", "data: b", "", "id", "data: c", ""])
        assert [e.id for e in events] == ["1", "1", ""]

    def test_id_without_data_still_sets_last_id(self) -> None:
        events = decode_all(["id: 7", "", "data: x", ""])
        assert [(e.id, e.data) for e in events] == [("7", "x")]

    def test_id_with_nul_is_ignored(self) -> None:
        [event] = decode_all(["id: 1", "id: 2\0", "data: x", ""])
        assert event.id == "1"

    def test_retry_field(self) -> None:
        decoder = SSEDecoder()
        for line in ["retry: 1500", "retry: soon", "data: x"]:
            decoder.decode(line)
        assert decoder.retry_ms == 1500
        assert decoder.decode("") == ServerSentEvent(data="x", id=None, retry_ms=1500)

    def test_unknown_fields_and_no_colon_lines_are_ignored(self) -> None:
        [event] = decode_all(["foo: bar", "event", "data: x", ""])
        assert (event.event, event.data) == ("message", "x")

    def test_value_may_contain_colons(self) -> None:
        [event] = decode_all(['data: {"a": "b:c"}', ""])
        assert event.data == '{"a": "b:c"}'

    def test_leading_bom_is_dropped(self) -> None:
        [event] = decode_all(["\ufeffdata: x", ""])
        assert event.data == "x"


class TestIterSse:
    STREAM = (
        ": ping\r\n\r\n"
        'id: 1-0\r\ndata: {"event_type": "pending"}\r\n\r\n'
        "id: 2-0\ndata: line one\ndata: line two\n\n"
        "event: custom\rid: 3-0\rdata: \u2028x\r\r"
        "id: 4-0\ndata: cut off at the end"
    )
    EXPECTED = [
        ServerSentEvent(data='{"event_type": "pending"}', id="1-0"),
        ServerSentEvent(data="line one\nline two", id="2-0"),
        ServerSentEvent(data="\u2028x", event="custom", id="3-0"),
    ]

    def test_whole_stream(self) -> None:
        # The last event has no blank line after it: a stream cut there must not dispatch it.
        assert list(iter_sse([self.STREAM])) == self.EXPECTED

    def test_any_chunking_gives_the_same_events(self) -> None:
        for size in range(1, 12):
            chunks = [self.STREAM[i : i + size] for i in range(0, len(self.STREAM), size)]
            assert list(iter_sse(chunks)) == self.EXPECTED, size
        for cut in range(len(self.STREAM)):
            assert list(iter_sse([self.STREAM[:cut], self.STREAM[cut:]])) == self.EXPECTED, cut
