"""Copy the web chat page's third-party browser modules from their pinned npm packages.

    python scripts/vendor_web.py           # npm ci, then (re)write static/vendor/ and its MANIFEST.json
    python scripts/vendor_web.py --check   # npm ci into a temporary copy; exit 1 if static/vendor differs

The packages are pinned in inference/server/web/package.json and package-lock.json. The copies are
committed, so the server needs neither Node nor the network; MANIFEST.json records each file's
package, version, source path and SHA-256, which the tests compare with the files and the lock file.
The only change made to a file is dropping its ``sourceMappingURL`` comment (the maps are not shipped).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WEB_DIR = ROOT / "inference" / "server" / "web"
VENDOR_DIR = ROOT / "inference" / "server" / "oasst_inference_server" / "static" / "vendor"
MANIFEST = VENDOR_DIR / "MANIFEST.json"

# vendored file name -> (npm package, path inside the package)
FILES: dict[str, tuple[str, str]] = {
    "marked.js": ("marked", "lib/marked.esm.js"),
    "marked.LICENSE": ("marked", "LICENSE"),
    "purify.js": ("dompurify", "dist/purify.es.mjs"),
    "purify.LICENSE": ("dompurify", "LICENSE"),
    "highlight.js": ("@highlightjs/cdn-assets", "es/highlight.min.js"),
    "highlight.LICENSE": ("@highlightjs/cdn-assets", "LICENSE"),
}
_SOURCE_MAP = re.compile(rb"^//# sourceMappingURL=\S+\s*$", re.MULTILINE)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def locked_versions(lock_file: Path) -> dict[str, str]:
    packages = json.loads(lock_file.read_text())["packages"]
    return {name.removeprefix("node_modules/"): info["version"] for name, info in packages.items() if name}


def vendored(node_modules: Path) -> dict[str, bytes]:
    """The vendored files' contents, made from an installed node_modules."""
    return {
        name: _SOURCE_MAP.sub(b"", (node_modules / pkg / path).read_bytes())
        for name, (pkg, path) in FILES.items()
    }


def manifest(files: dict[str, bytes], versions: dict[str, str]) -> dict[str, dict[str, str]]:
    return {
        name: {"package": pkg, "version": versions[pkg], "source": path, "sha256": sha256(files[name])}
        for name, (pkg, path) in FILES.items()
    }


def npm_ci(directory: Path) -> None:
    subprocess.run(["npm", "ci", "--ignore-scripts", "--no-audit", "--no-fund"], cwd=directory, check=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with a fresh npm ci, write nothing")
    args = parser.parse_args()
    if args.check:
        with tempfile.TemporaryDirectory() as tmp:
            for name in ("package.json", "package-lock.json"):
                shutil.copy(WEB_DIR / name, tmp)
            npm_ci(Path(tmp))
            files = vendored(Path(tmp) / "node_modules")
        stale = [
            n
            for n, data in files.items()
            if not (VENDOR_DIR / n).is_file() or (VENDOR_DIR / n).read_bytes() != data
        ]
        if stale:
            print(f"static/vendor differs from the pinned packages: {', '.join(stale)}", file=sys.stderr)
            return 1
        print("static/vendor matches the pinned packages")
        return 0
    npm_ci(WEB_DIR)
    files = vendored(WEB_DIR / "node_modules")
    VENDOR_DIR.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (VENDOR_DIR / name).write_bytes(data)
    entries = manifest(files, locked_versions(WEB_DIR / "package-lock.json"))
    MANIFEST.write_text(json.dumps(entries, indent=2) + "\n")
    print(f"wrote {len(files)} files to {VENDOR_DIR.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
