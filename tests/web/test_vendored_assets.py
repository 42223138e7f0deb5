"""The page's third-party modules are committed copies of pinned npm packages: the copies match what
scripts/vendor_web.py recorded, the records match the lock file, and the page loads nothing from
anywhere but its own server."""

from __future__ import annotations

import json
import re

from scripts import vendor_web

STATIC = vendor_web.VENDOR_DIR.parent


def test_vendored_files_are_the_pinned_packages_files():
    manifest = json.loads(vendor_web.MANIFEST.read_text())
    assert set(manifest) == set(vendor_web.FILES)
    locked = vendor_web.locked_versions(vendor_web.WEB_DIR / "package-lock.json")
    pinned = json.loads((vendor_web.WEB_DIR / "package.json").read_text())["dependencies"]
    for name, entry in manifest.items():
        package, source = vendor_web.FILES[name]
        assert (entry["package"], entry["source"]) == (package, source)
        assert entry["version"] == locked[package] == pinned[package], f"{name}: re-run scripts/vendor_web.py"
        data = (vendor_web.VENDOR_DIR / name).read_bytes()
        assert vendor_web.sha256(data) == entry["sha256"], f"{name} was changed by hand"
    # Exact versions only: a range would let `npm ci` and the copies drift apart.
    assert all(re.fullmatch(r"\d+\.\d+\.\d+", version) for version in pinned.values()), pinned
    assert set(vendor_web.VENDOR_DIR.iterdir()) == {
        vendor_web.VENDOR_DIR / n for n in [*manifest, "MANIFEST.json"]
    }


def test_the_page_loads_nothing_from_other_origins():
    # Markup and modules reference only this server's own paths (the CSP would block the rest).
    for path in [STATIC / "index.html", *(STATIC / "js").glob("*.js"), *(STATIC / "css").glob("*.css")]:
        text = path.read_text()
        assert not re.search(r"""(src|href)=["']?(https?:)?//""", text), path
        assert not re.search(r"""(import|from)\s*\(?\s*["'](https?:)?//""", text), path
        assert not re.search(r"url\(\s*[\"']?(https?:)?//", text), path
    for name in vendor_web.FILES:
        if name.endswith(".js"):
            text = (vendor_web.VENDOR_DIR / name).read_text()
            assert not re.search(r"""^\s*import\s.*["'](https?:)?//""", text, re.MULTILINE), name
            assert "sourceMappingURL" not in text, name
