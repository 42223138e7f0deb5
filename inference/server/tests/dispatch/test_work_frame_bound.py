"""A chat answer's work frame is bounded from the chat's size alone (so a submission needs no read of
the conversation): the bound is never less than the frame the claim builds, whatever the text holds
(escapes, control characters, non-ASCII, astral characters) and whatever the input budget cuts."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from oasst_inference_server.db.models import DbMessage
from oasst_inference_server.dispatch.claim import ChatRow, Taken
from oasst_inference_server.dispatch.work_frames import chat_frame_bound, work_frame
from oasst_shared.protocol import frame_bytes
from oasst_shared.sampling import SamplingParameters

# Text with every kind of character JSON writes differently: quotes, backslashes, control characters
# (six bytes each), non-ASCII and astral characters; never NUL or a lone surrogate (no frame carries
# those, and the API refuses them).
TEXT = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=300
)
SOME = st.sampled_from(['"', "\\", "\x01", "\n", "é", "日", "🙂", "a"])


@settings(max_examples=300, deadline=None)
@given(
    contents=st.lists(
        st.one_of(TEXT, st.builds(lambda c, n: c * n, SOME, st.integers(0, 400))), min_size=1, max_size=12
    ),
    system_prompt=st.one_of(st.none(), TEXT),
    max_input_tokens=st.one_of(st.none(), st.integers(1, 200)),
    extra_messages=st.integers(0, 3),
)
def test_the_bound_is_never_less_than_the_frame(contents, system_prompt, max_input_tokens, extra_messages):
    rows, parent_id = [], None
    for i, content in enumerate(contents):  # prompter and assistant by turns, the last a prompter
        role = "prompter" if (len(contents) - i) % 2 == 1 else "assistant"
        rows.append(ChatRow(f"m{i}", parent_id, role, content))
        parent_id = f"m{i}"
    # Messages of other branches count in the chat's size, not in the thread.
    others = [ChatRow(f"x{i}", None, "prompter", "elsewhere") for i in range(extra_messages)]
    message = DbMessage(
        id="a" * 36,
        chat_id="c" * 36,
        parent_id=parent_id,
        kind="chat",
        role="assistant",
        state="pending",
        model_config_name="SmolLM2-135M-Instruct",
        system_prompt=system_prompt,
        sampling_parameters=SamplingParameters(max_new_tokens=100, stop=["\x01é"]).model_dump(mode="json"),
        attempts=99,  # a retried message's frame: its attempt number is in the bound's room
    )
    chat = rows + others
    frame = work_frame(Taken(message, chat), max_input_tokens).frame
    bound = chat_frame_bound(
        message,
        chat_messages=len(chat),
        chat_characters=sum(len(r.content or "") for r in chat),
        newest_characters=len(contents[-1]),
        max_input_tokens=max_input_tokens,
    )
    assert bound >= frame_bytes(frame)
