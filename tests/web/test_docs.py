"""The web page's documentation shows screenshots that exist (the browser tests write them; the best
are copied to docs/images/)."""

from __future__ import annotations

import re

from tests.web.web_support import ROOT


def test_the_screenshots_the_docs_show_are_committed():
    shown = []
    for doc in (ROOT / "README.md", ROOT / "docs" / "web-chat.md"):
        for path in re.findall(r"""(?:src="|\]\()((?:docs/)?images/[\w.-]+\.png)""", doc.read_text()):
            image = (doc.parent / path).resolve()
            assert image.is_file(), f"{doc.name} shows {path}, which is missing"
            assert image.stat().st_size < 200_000, f"{path} is large: keep screenshots small"
            shown.append(image.name)
    assert {"web-chat-desktop-light.png", "web-chat-phone-dark.png"} <= set(shown)
