"""The references in docs/ that scripts/gen_docs.py generates must match the code as it is now."""

from __future__ import annotations

import difflib
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import BaseModel, Field
from pydantic.fields import FieldInfo

from scripts import gen_docs

ROOT = Path(__file__).resolve().parents[2]


def _diff(path: Path, expected: str) -> str:
    actual = path.read_text() if path.is_file() else ""
    lines = difflib.unified_diff(
        actual.splitlines(), expected.splitlines(), "committed", "generated", lineterm="", n=1
    )
    return "\n".join(list(lines)[:40])


@pytest.mark.parametrize("path", sorted(gen_docs.DOCS), ids=lambda p: p.name)
def test_the_committed_reference_is_what_the_generator_writes(path: Path):
    expected = gen_docs.DOCS[path]()
    assert path.is_file() and path.read_text() == expected, (
        f"{path.relative_to(ROOT)} is stale: run `make docs` and commit the result.\n{_diff(path, expected)}"
    )


def test_the_check_mode_agrees():
    result = subprocess.run(
        [sys.executable, "scripts/gen_docs.py", "--check"], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr


def test_every_setting_frame_and_field_is_described_and_no_note_is_orphaned():
    assert gen_docs.problems() == []


def test_the_protocol_reference_covers_every_frame_and_close_code():
    from oasst_shared import protocol

    text = (ROOT / "docs" / "protocol.md").read_text()
    for union in (protocol.WorkerFrame, protocol.ServerFrame):
        for frame in gen_docs._union_members(union):
            assert f"### {frame.model_fields['type'].default}\n" in text
            for name, info in frame.model_fields.items():
                assert f"| `{info.alias or name}` |" in text or name == "type"
    for name, value in vars(protocol).items():
        if name.startswith("CLOSE_"):
            assert f"| `{value}` | `{name}` |" in text


def test_the_configuration_reference_names_every_env_var():
    text = (ROOT / "docs" / "configuration.md").read_text()
    for component in gen_docs.COMPONENTS:
        for env in gen_docs.env_names(component.load()).values():
            assert f"| `{env}` |" in text


# ---------------------------------------------------------------- the checks can fail


def test_a_new_setting_makes_the_committed_reference_stale(monkeypatch):
    from oasst_worker import settings

    class Changed(settings.WorkerSettings):
        brand_new_knob: int = Field(default=3, description="A setting added after the docs were made")

    monkeypatch.setattr(settings, "WorkerSettings", Changed)
    rendered = gen_docs.render_configuration()
    assert "OASST_WORKER_BRAND_NEW_KNOB" in rendered and "A setting added after" in rendered
    assert rendered != gen_docs.CONFIGURATION_DOC.read_text()


def test_an_undescribed_setting_and_an_orphaned_note_are_reported(monkeypatch):
    from oasst_worker import settings

    class Changed(settings.WorkerSettings):
        mystery: int = 1

    monkeypatch.setattr(settings, "WorkerSettings", Changed)
    monkeypatch.setitem(gen_docs.MACHINE_DEFAULTS, "oasst_worker.settings:WorkerSettings.gone", "old")
    found = gen_docs.problems()
    assert any("OASST_WORKER_MYSTERY" in p for p in found)
    assert any("WorkerSettings.gone" in p for p in found)


def test_a_changed_frame_makes_the_protocol_reference_stale(monkeypatch):
    from oasst_shared import protocol

    reason = FieldInfo(annotation=str, default="", description="why")
    monkeypatch.setitem(protocol.Cancel.model_fields, "reason", reason)
    rendered = gen_docs.render_protocol()
    assert "| `reason` | str |" in rendered
    assert rendered != gen_docs.PROTOCOL_DOC.read_text()


def test_comments_above_a_field_become_its_description():
    class Example(BaseModel):
        # The first line
        # and the second.
        documented: int = 1
        # ------------------------------------------------ a section heading
        undocumented: int = 2
        inline: int = 3  # said beside it

    comments = gen_docs.source_comments(Example)
    assert comments == {"documented": "The first line and the second.", "inline": "said beside it"}
