"""Stand-in for the Grafana image in the compose stack test: NOT Grafana (Debian has no package).

It checks what the compose file gives Grafana, the way Grafana reads it: the provisioning folder
(``GF_PATHS_PROVISIONING``, default ``/etc/grafana/provisioning``) with ``datasources/*.yaml`` and
``dashboards/*.yaml`` providers whose ``options.path`` holds the dashboard JSON files, with ``$VAR``
and ``${VAR}`` expanded from the environment. A malformed file stops it at start, as it stops Grafana.
It serves the few API routes the test uses, behind the admin user of ``GF_SECURITY_ADMIN_USER`` /
``GF_SECURITY_ADMIN_PASSWORD``: ``/api/health``, ``/api/datasources``, ``/api/search``,
``/api/dashboards/uid/UID`` and the datasource proxy ``/api/datasources/proxy/uid/UID/PATH``.
"""

from __future__ import annotations

import base64
import hmac
import json
import os
import re
import sys
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import yaml

_VAR = re.compile(r"\$(?:\{(\w+)\}|(\w+))")


def expand(text: str) -> str:
    return _VAR.sub(lambda m: os.environ.get(m.group(1) or m.group(2), ""), text)


def load_yaml_files(folder: Path) -> list[dict]:
    files = sorted([*folder.glob("*.yaml"), *folder.glob("*.yml")]) if folder.is_dir() else []
    return [yaml.safe_load(expand(path.read_text())) or {} for path in files]


def load_provisioning(root: Path) -> tuple[list[dict], dict[str, dict]]:
    datasources = [ds for doc in load_yaml_files(root / "datasources") for ds in doc.get("datasources", [])]
    for ds in datasources:
        for key in ("name", "type", "url"):
            if not ds.get(key):
                raise SystemExit(f"datasource without {key}: {ds}")
    dashboards: dict[str, dict] = {}
    for doc in load_yaml_files(root / "dashboards"):
        for provider in doc.get("providers", []):
            folder = Path(provider["options"]["path"])
            if not folder.is_dir():
                raise SystemExit(f"dashboard provider {provider.get('name')}: no folder {folder}")
            for path in sorted(folder.rglob("*.json")):
                dashboard = json.loads(path.read_text())
                dashboards[dashboard["uid"]] = dashboard
    return datasources, dashboards


class Handler(BaseHTTPRequestHandler):
    datasources: list[dict] = []
    dashboards: dict[str, dict] = {}
    credentials = ("admin", "admin")

    def do_GET(self) -> None:  # noqa: N802 - the http.server API
        path, _, query = self.path.partition("?")
        if path == "/api/health":
            return self.reply(200, {"database": "ok", "version": "stand-in"})
        if not self.authorised():
            return self.reply(401, {"message": "Unauthorized"})
        if path == "/api/datasources":
            return self.reply(200, self.datasources)
        if path == "/api/search":
            found = [
                {"uid": uid, "title": d.get("title"), "type": "dash-db"} for uid, d in self.dashboards.items()
            ]
            return self.reply(200, found)
        if path.startswith("/api/dashboards/uid/"):
            dashboard = self.dashboards.get(path.rsplit("/", 1)[1])
            if dashboard is None:
                return self.reply(404, {"message": "Dashboard not found"})
            return self.reply(200, {"dashboard": dashboard, "meta": {"provisioned": True}})
        match = re.fullmatch(r"/api/datasources/proxy/uid/([^/]+)/(.*)", path)
        if match:
            return self.proxy(match.group(1), match.group(2), query)
        return self.reply(404, {"message": "Not found"})

    def authorised(self) -> bool:
        header = self.headers.get("Authorization", "")
        if not header.startswith("Basic "):
            return False
        expected = base64.b64encode(":".join(self.credentials).encode()).decode()
        return hmac.compare_digest(header[6:], expected)

    def proxy(self, uid: str, rest: str, query: str) -> None:
        source = next((ds for ds in self.datasources if ds.get("uid") == uid), None)
        if source is None:
            return self.reply(404, {"message": "Data source not found"})
        url = source["url"].rstrip("/") + "/" + rest + (f"?{query}" if query else "")
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                return self.reply(response.status, json.loads(response.read()))
        except urllib.error.HTTPError as exc:
            return self.reply(exc.code, json.loads(exc.read() or b"{}"))
        except OSError as exc:
            return self.reply(502, {"message": f"data source unreachable: {exc}"})

    def reply(self, status: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def main() -> None:
    root = Path(os.environ.get("GF_PATHS_PROVISIONING", "/etc/grafana/provisioning"))
    Handler.datasources, Handler.dashboards = load_provisioning(root)
    Handler.credentials = (
        os.environ.get("GF_SECURITY_ADMIN_USER", "admin"),
        os.environ.get("GF_SECURITY_ADMIN_PASSWORD", "admin"),
    )
    port = int(os.environ.get("GF_SERVER_HTTP_PORT", "3000"))
    print(
        f"grafana stand-in: {len(Handler.datasources)} datasources, dashboards {sorted(Handler.dashboards)}, "
        f"port {port}",
        file=sys.stderr,
        flush=True,
    )
    ThreadingHTTPServer(("0.0.0.0", port), Handler).serve_forever()


if __name__ == "__main__":
    main()
