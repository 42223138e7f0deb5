"""deploy/k8s: every manifest is valid against the Kubernetes API schemas, and the pieces fit together.

The schemas are the ones the PyPI package kubernetes-validate ships (strict: unknown fields are
errors), for the oldest Kubernetes release still supported upstream that the manifests target. The
cross-checks are what a schema cannot see: selectors that match, references that exist, settings that
are read by the component they are given to, the probes, the disruption budget and the ingress
annotations that streaming needs.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from scripts import gen_docs
from tests.ops.test_compose import settings_class

K8S = Path(__file__).resolve().parents[2] / "deploy" / "k8s"
KUBERNETES_VERSION = "1.30"
PLACEHOLDER = "64-random-hex-characters"  # in secret.example.yaml
SETTINGS = {
    "server": "oasst_inference_server.settings:Settings",
    "worker": "oasst_worker.settings:WorkerSettings",
}


def documents(name: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all((K8S / name).read_text()) if doc]


def manifests() -> dict[tuple[str, str], dict[str, Any]]:
    found = {}
    for path in sorted(K8S.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for doc in documents(path.name):
            found[(doc["kind"], doc["metadata"]["name"])] = doc
    return found


def kustomization() -> dict[str, Any]:
    return documents("kustomization.yaml")[0]


@pytest.mark.parametrize("path", sorted(p.name for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml"))
def test_each_manifest_is_valid_against_the_kubernetes_schema(path: str) -> None:
    for doc in documents(path):
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_the_validator_catches_a_wrong_type_and_an_unknown_field() -> None:
    deployment = manifests()[("Deployment", "oasst-server")]
    wrong_type = {**deployment, "spec": {**deployment["spec"], "replicas": "three"}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(wrong_type, KUBERNETES_VERSION, strict=True)
    unknown = {**deployment, "spec": {**deployment["spec"], "replica": 3}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(unknown, KUBERNETES_VERSION, strict=True)


def test_the_kustomization_lists_every_manifest_but_the_secret_example() -> None:
    listed = kustomization()["resources"]
    on_disk = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml", "secret.example.yaml"}
    assert sorted(listed) == sorted(on_disk)
    images = {i["name"] for i in kustomization()["images"]}
    used = {
        c["image"]
        for doc in manifests().values()
        if doc["kind"] == "Deployment"
        for c in doc["spec"]["template"]["spec"]["containers"]
        if c["image"].startswith("oasst-")
    }
    assert used == images


def test_services_pdb_and_ingress_point_at_what_exists() -> None:
    found = manifests()
    server = found[("Deployment", "oasst-server")]
    labels = server["spec"]["template"]["metadata"]["labels"]
    assert server["spec"]["replicas"] >= 2
    assert server["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    service = found[("Service", "oasst-server")]
    assert service["spec"]["selector"].items() <= labels.items()
    port_names = {p["name"] for c in server["spec"]["template"]["spec"]["containers"] for p in c["ports"]}
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= port_names
    pdb = found[("PodDisruptionBudget", "oasst-server")]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert pdb["spec"]["minAvailable"] < server["spec"]["replicas"]

    ingress = found[("Ingress", "oasst-server")]
    backend = ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
    assert backend["name"] == "oasst-server"
    assert backend["port"]["name"] in {p["name"] for p in service["spec"]["ports"]}
    annotations = ingress["metadata"]["annotations"]
    # Server-sent events and websockets: nothing buffered, long timeouts.
    assert annotations["nginx.ingress.kubernetes.io/proxy-buffering"] == "off"
    assert int(annotations["nginx.ingress.kubernetes.io/proxy-read-timeout"]) >= 600
    assert int(annotations["nginx.ingress.kubernetes.io/proxy-send-timeout"]) >= 600
    assert ingress["spec"]["tls"][0]["secretName"]


def test_probes_and_non_root_containers() -> None:
    found = manifests()
    server = found[("Deployment", "oasst-server")]["spec"]["template"]["spec"]
    container = server["containers"][0]
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"
    assert container["startupProbe"]["httpGet"]["path"] == "/health"
    assert server["securityContext"]["runAsNonRoot"] is True
    assert server["securityContext"]["runAsUser"] == 10001  # the user of the image
    worker = found[("Deployment", "oasst-worker")]["spec"]["template"]["spec"]
    relay = next(c for c in worker["containers"] if c["name"] == "worker")
    assert relay["securityContext"]["runAsNonRoot"] is True
    assert relay["livenessProbe"]["httpGet"]["port"] == "metrics"
    tgi = next(c for c in worker["containers"] if c["name"] == "tgi")
    assert tgi["resources"]["limits"]["nvidia.com/gpu"] == 1
    # The worker reaches TGI on the pod's own address, at the port TGI is told to use.
    tgi_port = next(e["value"] for e in tgi["env"] if e["name"] == "PORT")
    backend_url = next(e["value"] for e in relay["env"] if e["name"] == "OASST_WORKER_BACKEND_URL")
    assert backend_url == f"http://127.0.0.1:{tgi_port}"


def _environment(container: dict[str, Any], found: dict[tuple[str, str], dict[str, Any]]) -> set[str]:
    names = {e["name"] for e in container.get("env", [])}
    for source in container.get("envFrom", []):
        names |= set(found[("ConfigMap", source["configMapRef"]["name"])]["data"])
    return names


def test_every_variable_is_read_by_its_component_and_every_secret_key_exists() -> None:
    found = manifests()
    secret = found[("Secret", "oasst-secrets")]["stringData"]
    for deployment, container_name, component in (
        ("oasst-server", "server", "server"),
        ("oasst-worker", "worker", "worker"),
    ):
        spec = found[("Deployment", deployment)]["spec"]["template"]["spec"]
        container = next(c for c in spec["containers"] if c["name"] == container_name)
        allowed = set(gen_docs.env_names(settings_class(SETTINGS[component])).values())
        assert _environment(container, found) <= allowed, _environment(container, found) - allowed
        for variable in container.get("env", []):
            ref = variable.get("valueFrom", {}).get("secretKeyRef")
            if ref:
                assert ref["name"] == "oasst-secrets" and ref["key"] in secret, ref


def test_the_server_gets_every_setting_that_is_unsafe_by_default(
    monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    """The ConfigMap plus the secret's shape, with the placeholders filled in, make a valid production
    configuration; with the placeholders left in, production refuses to start."""
    found = manifests()
    monkeypatch.chdir(tmp_path)
    for key in list(os.environ):
        if key.startswith("OASST_"):
            monkeypatch.delenv(key)
    values = {
        **found[("ConfigMap", "oasst-server-config")]["data"],
        **found[("Secret", "oasst-secrets")]["stringData"],
    }
    for key, value in values.items():
        if key.startswith("OASST_SERVER_"):
            monkeypatch.setenv(key, value)
    with pytest.raises(ValueError, match="OASST_SERVER_AUTH_SECRET"):
        settings_class(SETTINGS["server"])()
    for key, value in values.items():
        if key.startswith("OASST_SERVER_"):
            monkeypatch.setenv(key, value.replace(PLACEHOLDER, secrets.token_hex(32)))
    settings = settings_class(SETTINGS["server"])()
    assert settings.environment == "production" and settings.allow_debug_auth is False
    assert settings.database_url.startswith("postgresql+asyncpg://")
    assert settings.broker_url.startswith("redis://")
    assert settings.admin_root_token
