from __future__ import annotations

from pathlib import Path

import pytest

from oasst_shared.model_configs import ParameterConfig
from oasst_shared.sampling import SamplingParameters
from oasst_shared.schemas import ModelConfigInfo
from oasst_text_client._exceptions import ModelUnavailable
from oasst_text_client.cli import DEFAULT_SERVER_URL, parse_args, sampling_error
from oasst_text_client.session import choose_model, effective_sampling


def usage_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exc_info:
        parse_args(argv, env={})
    assert exc_info.value.code == 2
    return capsys.readouterr().err


def test_defaults() -> None:
    options = parse_args([], env={"HOME": "/home/u"})
    assert options.server_url == DEFAULT_SERVER_URL == "http://127.0.0.1:8000"
    assert options.username == "cli-user"
    assert options.model is None
    assert options.system_prompt is None
    assert options.sampling_overrides == {}
    assert options.buffer is False
    assert options.history_file == Path("/home/u/.local/state/oasst-chat/history")
    assert options.api_key is None


def test_an_api_key_from_the_flag_or_the_environment() -> None:
    assert parse_args([], env={"OASST_API_KEY": "oak-from-env"}).api_key == "oak-from-env"
    assert parse_args(["--api-key", "oak-flag"], env={"OASST_API_KEY": "oak-env"}).api_key == "oak-flag"
    assert parse_args(["--api-key", "  "], env={}).api_key is None


def test_environment_supplies_defaults_and_flags_win() -> None:
    env = {"OASST_SERVER_URL": "http://server:9000/", "OASST_USERNAME": "ann", "OASST_MODEL": "m1"}
    options = parse_args([], env=env)
    assert (options.server_url, options.username, options.model) == ("http://server:9000", "ann", "m1")
    options = parse_args(["--server-url", "https://x.example", "--model", "m2"], env=env)
    assert (options.server_url, options.model) == ("https://x.example", "m2")


def test_sampling_flags() -> None:
    options = parse_args(
        [
            "--temperature=0.5",
            "--top-p=0.9",
            "--top-k=40",
            "--typical-p=0.95",
            "--repetition-penalty=1.2",
            "--max-new-tokens=100",
            "--seed=42",
            "--stop",
            "User:",
            "--stop=\n\n",
            "--system-prompt",
            "Be brief.",
        ],
        env={},
    )
    assert options.sampling_overrides == {
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": 40,
        "typical_p": 0.95,
        "repetition_penalty": 1.2,
        "max_new_tokens": 100,
        "seed": 42,
        "stop": ["User:", "\n\n"],
    }
    assert options.system_prompt == "Be brief."


def test_greedy() -> None:
    assert parse_args(["--greedy"], env={}).sampling_overrides == {"do_sample": False}
    assert parse_args(["--greedy", "--temperature=0"], env={}).sampling_overrides == {
        "temperature": 0.0,
        "do_sample": False,
    }


def test_greedy_with_positive_temperature_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert "--greedy and a positive --temperature" in usage_error(capsys, ["--greedy", "--temperature=1"])


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--top-p=1.5"], "--top-p"),
        (["--top-p=0"], "--top-p"),
        (["--top-k=0"], "--top-k"),
        (["--typical-p=2"], "--typical-p"),
        (["--temperature=-1"], "--temperature"),
        (["--repetition-penalty=0"], "--repetition-penalty"),
        (["--max-new-tokens=0"], "--max-new-tokens"),
        (["--seed=-3"], "--seed"),
        (["--stop="], "--stop"),
        ([f"--stop={i}" for i in range(9)], "--stop"),
    ],
)
def test_out_of_range_sampling_is_a_usage_error_naming_the_flag(
    capsys: pytest.CaptureFixture[str], argv: list[str], flag: str
) -> None:
    err = usage_error(capsys, argv)
    assert "invalid sampling parameter" in err
    assert f"{flag}:" in err
    assert "Traceback" not in err


def test_non_numbers_are_refused_by_argparse(capsys: pytest.CaptureFixture[str]) -> None:
    assert "--top-k: invalid int value" in usage_error(capsys, ["--top-k=many"])


def test_bad_server_url(capsys: pytest.CaptureFixture[str]) -> None:
    assert "--server-url must start with http://" in usage_error(capsys, ["--server-url", "localhost:8000"])


def test_sampling_error_lists_every_problem() -> None:
    message = sampling_error({"top_p": 3.0, "top_k": -1})
    assert message is not None
    assert "--top-p:" in message and "--top-k:" in message
    assert sampling_error({"top_p": 0.5}) is None


def _model(name: str, preset: SamplingParameters | None = None) -> ModelConfigInfo:
    configs = [ParameterConfig(name="default", sampling_parameters=preset)] if preset else []
    return ModelConfigInfo(
        name=name, model_id=name, max_input_length=100, max_total_length=200, parameter_configs=configs
    )


def test_choose_model() -> None:
    models = [_model("a"), _model("b")]
    assert choose_model(models, None).name == "a"
    assert choose_model(models, "b").name == "b"
    with pytest.raises(ModelUnavailable) as exc_info:
        choose_model(models, "c")
    assert str(exc_info.value) == "unknown model 'c'; available models: a, b"
    assert exc_info.value.available == ["a", "b"]
    with pytest.raises(ModelUnavailable, match="no model is available"):
        choose_model([], None)


def test_effective_sampling_puts_flags_over_the_models_preset() -> None:
    preset = SamplingParameters(temperature=0.8, top_p=0.9, max_new_tokens=256)
    merged = effective_sampling(_model("a", preset), {"top_p": 0.5, "stop": ["x"]})
    assert (merged.temperature, merged.top_p, merged.max_new_tokens, merged.stop) == (0.8, 0.5, 256, ["x"])
    greedy = effective_sampling(_model("a", preset), {"do_sample": False})
    assert greedy.is_greedy and greedy.temperature is None
    assert effective_sampling(_model("a"), {}) == SamplingParameters()
