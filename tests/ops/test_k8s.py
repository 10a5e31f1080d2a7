"""The Kubernetes manifests: schema-valid (kubernetes-validate, offline, when installed) and
consistent with each other, the image and the gateway's configuration."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest

from kvgateway.config.errors import ConfigError
from kvgateway.config.loading import read_token_file
from kvgateway.config.settings import expand_source
from kvgateway.config.sources import source_from_mapping
from tests.support.command_line import serve_file_settings
from tests.support.deploy import K8S, RULES, load_yaml_all

KUBERNETES_VERSION = "1.29.0"  # the oldest release the manifests are meant for
CORE_KINDS = {"ConfigMap", "Deployment", "NetworkPolicy", "Secret", "Service"}


def manifests() -> dict[str, dict[str, Any]]:
    """kind -> the manifest, from every file in deploy/k8s (one kind each)."""
    out: dict[str, dict[str, Any]] = {}
    for path in sorted(K8S.glob("*.yaml")):
        for document in load_yaml_all(path):
            assert isinstance(document, dict), path
            assert document["kind"] not in out, f"two {document['kind']} manifests"
            out[document["kind"]] = document
    return out


def pod_spec() -> dict[str, Any]:
    spec = manifests()["Deployment"]["spec"]["template"]["spec"]
    assert isinstance(spec, dict)
    return spec


def container() -> dict[str, Any]:
    (only,) = pod_spec()["containers"]
    assert isinstance(only, dict)
    return only


def test_the_expected_manifests_exist() -> None:
    assert set(manifests()) == CORE_KINDS | {"ServiceMonitor"}


@pytest.mark.parametrize("kind", sorted(CORE_KINDS))
def test_schema_valid(kind: str) -> None:
    validator = pytest.importorskip(
        "kubernetes_validate", reason="kubernetes-validate is not installed (pip install kubernetes-validate)"
    )
    manifest = manifests()[kind]
    for version in (KUBERNETES_VERSION, validator.latest_version()):
        try:
            validator.validate(manifest, version, strict=True)
        except validator.ValidationError as exc:
            pytest.fail(f"{kind} is invalid for Kubernetes {version}: {exc.message} at {list(exc.path)}")


def test_service_monitor() -> None:
    """No schema for the Prometheus Operator's CRD offline: check the fields that matter."""
    monitor = manifests()["ServiceMonitor"]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    service = manifests()["Service"]
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    port_names = {port["name"] for port in service["spec"]["ports"]}
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in port_names
    assert endpoint["path"] == "/metrics"
    assert set(endpoint) <= {"port", "path", "scheme", "interval", "scrapeTimeout", "honorLabels", "relabelings"}
    # the job label is the Service's app.kubernetes.io/name, which KVGatewayDown matches
    job = service["metadata"]["labels"][monitor["spec"]["jobLabel"]]
    assert f'up{{job="{job}"}}' in RULES.read_text(encoding="utf-8")


def test_service_and_network_policy_select_the_pods() -> None:
    kinds = manifests()
    pod_labels = kinds["Deployment"]["spec"]["template"]["metadata"]["labels"]
    assert kinds["Deployment"]["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert kinds["Service"]["spec"]["selector"].items() <= pod_labels.items()
    assert kinds["NetworkPolicy"]["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items()
    (port,) = kinds["Service"]["spec"]["ports"]
    container_ports = {p["name"]: p["containerPort"] for p in container()["ports"]}
    assert port["targetPort"] in container_ports
    allowed = {p["port"] for rule in kinds["NetworkPolicy"]["spec"]["ingress"] for p in rule["ports"]}
    assert container_ports[port["targetPort"]] in allowed


def test_probes() -> None:
    c = container()
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    names = {p["name"] for p in c["ports"]}
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        assert c[probe]["httpGet"]["port"] in names


def test_pod_is_locked_down() -> None:
    spec = pod_spec()
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["automountServiceAccountToken"] is False
    security = container()["securityContext"]
    assert security["allowPrivilegeEscalation"] is False
    assert security["readOnlyRootFilesystem"] is True
    assert security["capabilities"]["drop"] == ["ALL"]
    assert "memory" in container()["resources"]["limits"]
    assert not container()["image"].endswith(":latest")


def test_config_and_token_are_mounted_where_the_config_says(tmp_path: Path) -> None:
    kinds = manifests()
    c = container()
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in pod_spec()["volumes"]}
    config_map = kinds["ConfigMap"]
    secret = kinds["Secret"]
    (config_volume,) = [
        name for name, v in volumes.items() if v.get("configMap", {}).get("name") == config_map["metadata"]["name"]
    ]
    (token_volume,) = [
        name for name, v in volumes.items() if v.get("secret", {}).get("secretName") == secret["metadata"]["name"]
    ]
    (file_name,) = config_map["data"]
    config_path = f"{mounts[config_volume]}/{file_name}"
    assert c["args"] == ["kvgateway", "serve", "--config", config_path]

    data = tomllib.loads(config_map["data"][file_name])
    (token_key,) = secret["stringData"]
    assert data["server"]["token_file"] == f"{mounts[token_volume]}/{token_key}"
    assert data["server"]["port"] == {p["name"]: p["containerPort"] for p in c["ports"]}["http"]

    # the configuration loads as the container's command loads it
    settings = serve_file_settings(config_map["data"][file_name], tmp_path)
    assert settings.host == "0.0.0.0" and settings.token


def test_secret_fails_closed() -> None:
    """The shipped Secret is empty: the gateway refuses an empty token file instead of running with a
    token everybody can read in this repository."""
    secret = manifests()["Secret"]
    assert secret["stringData"]["token"] == ""
    with pytest.raises(ConfigError, match="empty"):
        read_token_file(str(Path("/dev/null")))


def test_network_policy_allows_the_engine_ports() -> None:
    kinds = manifests()
    data = tomllib.loads(next(iter(kinds["ConfigMap"]["data"].values())))
    egress_ranges = [
        (p["port"], p.get("endPort", p["port"]))
        for rule in kinds["NetworkPolicy"]["spec"]["egress"]
        for p in rule.get("ports", [])
        if p["protocol"] == "TCP"
    ]
    for raw in data["sources"]:
        source = source_from_mapping(raw, "test")
        for stream in expand_source(source):
            for address in (stream.endpoint, stream.replay):
                assert address is not None
                port = int(address.rsplit(":", 1)[1])
                assert any(low <= port <= high for low, high in egress_ranges), f"{address} not allowed out"
