"""A worker connection takes the moderation hook on answers only when it checks answers: otherwise a token
meets no watch (and no check of the hook's settings) on its way to the relay."""

from __future__ import annotations

import pytest

from oasst_inference_server.moderation.answer_watch import AnswerWatch
from oasst_inference_server.moderation.hook import Moderation
from oasst_inference_server.settings import Settings
from oasst_inference_server.workers.in_flight import InFlight
from oasst_inference_server.workers.worker_connection import WorkerConnection
from oasst_shared.model_configs import SMOLLM2_135M
from oasst_shared.protocol import ChatTurn, Work, WorkerInfo

WORDS = {"bad": ["kill"]}


class _Dispatcher:
    def capacity_changed(self) -> None:
        pass


def _connection(**moderation_settings: object) -> WorkerConnection:
    settings = Settings(database_url="sqlite+aiosqlite://", **moderation_settings)  # type: ignore[arg-type]
    return WorkerConnection(
        None,  # type: ignore[arg-type]  # never touched before run()
        WorkerInfo(model_config=SMOLLM2_135M, max_parallel_requests=2, backend_kind="tgi"),
        settings=settings,
        broker=None,  # type: ignore[arg-type]
        lifecycle=None,  # type: ignore[arg-type]
        dispatcher=_Dispatcher(),  # type: ignore[arg-type]
        moderation=Moderation(settings, None),  # type: ignore[arg-type]
    )


def _answer() -> InFlight:
    work = Work(
        message_id="m",
        model_config_name=SMOLLM2_135M.name,
        thread=[ChatTurn(role="user", content="hello")],
    )
    return InFlight.claimed("m", work, spot_checked=False)


@pytest.mark.parametrize(
    "off",
    [
        {},  # moderation off
        {"moderation_enabled": True},  # on, but nothing to check with
        {"moderation_enabled": True, "moderation_word_lists": WORDS, "moderation_check_answers": False},
    ],
)
def test_a_connection_holds_no_hook_while_answers_are_not_moderated(off: dict[str, object]):
    connection = _connection(**off)
    assert connection._moderation is None
    record = _answer()
    assert connection._watch(record) is None and record.moderation is None


def test_a_moderated_answer_gets_its_watch_at_its_first_token():
    connection = _connection(moderation_enabled=True, moderation_word_lists=WORDS)
    assert connection._moderation is not None and connection._moderation.on_answers
    record = _answer()
    watch = connection._watch(record)
    assert isinstance(watch, AnswerWatch) and record.moderation is watch
    assert connection._watch(record) is watch
