"""deploy/k8s-cluster: schema-valid, the commands parse, and the pieces fit each other and
deploy/k8s (the shared ConfigMap and token Secret)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kvgateway import cli
from tests.support.deploy import K8S, load_yaml_all

CLUSTER = Path(__file__).resolve().parents[2] / "deploy" / "k8s-cluster"
KUBERNETES_VERSION = "1.29.0"


def documents(name: str) -> list[dict[str, Any]]:
    return [doc for doc in load_yaml_all(CLUSTER / name) if isinstance(doc, dict)]


def by_kind(name: str) -> dict[str, dict[str, Any]]:
    return {doc["kind"]: doc for doc in documents(name)}


@pytest.mark.parametrize("name", ["ingest.yaml", "edge.yaml"])
def test_schema_valid(name: str) -> None:
    validator = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is not installed")
    for manifest in documents(name):
        try:
            validator.validate(manifest, KUBERNETES_VERSION, strict=True)
        except validator.ValidationError as exc:
            pytest.fail(f"{name} {manifest['kind']}: {exc.message} at {list(exc.path)}")


@pytest.mark.parametrize(("name", "role"), [("ingest.yaml", "ingest"), ("edge.yaml", "edge")])
def test_the_role_command_parses_and_uses_the_shared_config(name: str, role: str) -> None:
    pod = by_kind(name)["Deployment"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    argv = container["args"]
    assert argv[:2] == ["kvgateway", role]
    args = cli.build_parser().parse_args(argv[1:])
    assert args.nats == ["nats://nats:4222"]  # the Service the NATS chart creates for release "nats"
    shared = {doc["kind"]: doc for path in K8S.glob("*.yaml") for doc in load_yaml_all(path)}
    names = {volume.get("configMap", {}).get("name") for volume in pod["volumes"]}
    assert shared["ConfigMap"]["metadata"]["name"] in names
    assert args.config == "/etc/kvgateway/" + next(iter(shared["ConfigMap"]["data"]))


def test_the_edge_service_and_budget_select_the_edge_pods() -> None:
    kinds = by_kind("edge.yaml")
    labels = kinds["Deployment"]["spec"]["template"]["metadata"]["labels"]
    assert kinds["Service"]["spec"]["selector"].items() <= labels.items()
    assert kinds["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert kinds["PodDisruptionBudget"]["spec"]["minAvailable"] < kinds["Deployment"]["spec"]["replicas"]


def test_the_nats_values_enable_a_replicated_file_store() -> None:
    (values,) = documents("nats-values.yaml")
    assert values["config"]["jetstream"]["fileStore"]["enabled"] is True
    ingest_args = by_kind("ingest.yaml")["Deployment"]["spec"]["template"]["spec"]["containers"][0]["args"]
    replicas = int(ingest_args[ingest_args.index("--nats-replicas") + 1])
    assert replicas <= values["config"]["cluster"]["replicas"]
