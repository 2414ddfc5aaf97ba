"""deploy/: the files parse and carry what running Inferno needs. No Docker engine or cluster runs here: these
read the files, cross-check them against each other and against the code, and let promtool check Prometheus's."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

from orchestrator.config import ServerConfig
from orchestrator.scheduler.scheduler import FAREWELL_S
from tests.observability.conftest import DEPLOY

K8S = DEPLOY / "k8s"
DRAIN_TIMEOUT_S = 30  # what the images and manifests set INFERNO_DRAIN_TIMEOUT_S to
SCRAPE_KEY_FILE = "/run/secrets/inferno_scrape_key"  # where compose puts Prometheus's scrape key


def load_yaml(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def k8s_objects() -> dict[str, dict]:
    """Every Kubernetes object under deploy/k8s, by kind."""
    objects = {}
    for path in sorted(K8S.glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            if document and "kind" in document and document["kind"] != "Kustomization":
                objects[document["kind"]] = document
    return objects


@pytest.fixture(scope="module")
def k8s() -> dict[str, dict]:
    return k8s_objects()


def container(k8s) -> dict:
    [server] = k8s["Deployment"]["spec"]["template"]["spec"]["containers"]
    return server


def env_of(server: dict) -> dict[str, str]:
    return {item["name"]: item.get("value") for item in server.get("env", [])}


# -- container images -----------------------------------------------------------------------------------------
def dockerfile(name: str) -> str:
    return (DEPLOY / "docker" / name).read_text()


def test_gpu_image_is_built_on_the_tensorrt_llm_release_the_code_targets():
    pyproject = tomllib.loads((DEPLOY.parent / "pyproject.toml").read_text())
    [pin] = pyproject["project"]["optional-dependencies"]["trtllm"]
    version = pin.split("==")[1]
    assert re.search(rf"^FROM nvcr\.io/nvidia/tensorrt-llm/release:{re.escape(version)}$", dockerfile("gpu.Dockerfile"),
                     re.MULTILINE)
    assert f"assert v == '{version}'" in dockerfile("gpu.Dockerfile")  # the build fails if the base drifts


def test_cpu_image_builds_the_embedded_default_into_a_slim_python_image():
    text = dockerfile("cpu.Dockerfile")
    assert re.findall(r"^FROM (\S+)", text, re.MULTILINE)[-1].startswith("python:3.12-slim")
    assert "inferno build smollm2-135m-hf --name smollm2-135m" in text  # served under the default's name
    assert "download.pytorch.org/whl/cpu" in text


@pytest.mark.parametrize("name", ["cpu.Dockerfile", "gpu.Dockerfile"])
def test_images_serve_on_all_interfaces_and_drain_on_sigterm(name):
    text = dockerfile(name)
    assert 'ENTRYPOINT ["inferno"]' in text and 'CMD ["serve"]' in text
    assert "INFERNO_HOST=0.0.0.0" in text
    assert f"INFERNO_DRAIN_TIMEOUT_S={DRAIN_TIMEOUT_S}" in text
    assert "STOPSIGNAL SIGTERM" in text
    copied = re.findall(r"^COPY (?!--from)(\S+)", text, re.MULTILINE)
    assert copied and all((DEPLOY.parent / path).exists() for path in copied), copied
    ignore = (DEPLOY / "docker" / f"{name}.dockerignore").read_text()
    assert all(f"!{path.rstrip('/')}" in ignore for path in copied)


# -- compose ----------------------------------------------------------------------------------------------------
def test_compose_runs_inferno_prometheus_and_grafana_with_their_config_mounted():
    compose = load_yaml(DEPLOY / "compose.yaml")
    services = compose["services"]
    assert set(services) == {"inferno", "prometheus", "grafana"}
    build = services["inferno"]["build"]
    assert (DEPLOY / build["context"] / build["dockerfile"]).is_file()
    assert "127.0.0.1:8000:8000" in services["inferno"]["ports"]
    for service in ("prometheus", "grafana"):
        image = services[service]["image"]
        assert re.fullmatch(r"[\w./-]+:v?\d+\.\d+\.\d+", image), f"{service}: pin a version, not {image}"
        for volume in services[service]["volumes"]:
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (DEPLOY / source).exists(), volume
    grace = int(services["inferno"]["stop_grace_period"].rstrip("s"))
    assert grace > DRAIN_TIMEOUT_S + ServerConfig().worker.stop_timeout_s


def test_compose_prometheus_scrapes_the_inferno_service():
    config = load_yaml(DEPLOY / "prometheus" / "prometheus.yml")
    [job] = [job for job in config["scrape_configs"] if job["job_name"] == "inferno"]
    assert job["metrics_path"] == "/metrics"
    assert job["static_configs"][0]["targets"] == ["inferno:8000"]


def test_compose_gpu_override_reserves_nvidia_gpus_and_mounts_engines():
    override = load_yaml(DEPLOY / "compose.gpu.yaml")["services"]["inferno"]
    assert override["build"]["dockerfile"] == "deploy/docker/gpu.Dockerfile"
    [device] = override["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and "gpu" in device["capabilities"]
    assert any(volume.endswith(":/engines") for volume in override["volumes"])


def test_grafana_provisioning_points_at_the_dashboards_and_prometheus():
    compose = load_yaml(DEPLOY / "compose.yaml")["services"]["grafana"]
    mounts = dict(volume.split(":")[:2] for volume in compose["volumes"] if volume.startswith("."))
    provider = load_yaml(DEPLOY / "grafana" / "provisioning" / "dashboards" / "inferno.yaml")["providers"][0]
    assert mounts["./grafana/dashboards"] == provider["options"]["path"]
    assert mounts["./grafana/provisioning"] == "/etc/grafana/provisioning"
    [source] = load_yaml(DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yaml")["datasources"]
    assert source["type"] == "prometheus" and source["url"] == "http://prometheus:9090"


def test_dashboard_panels_are_complete():
    dashboard = json.loads((DEPLOY / "grafana" / "dashboards" / "inferno.json").read_text())
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    variables = {variable["name"] for variable in dashboard["templating"]["list"]}
    assert {"datasource", "model"} <= variables
    titles = " ".join(panel["title"].lower() for panel in dashboard["panels"])
    for topic in ("requests per second", "tokens per second", "time to first token", "inter-token", "queue",
                  "kv cache usage", "model states", "model memory", "device memory"):
        assert topic in titles, topic
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]
            assert target["expr"].strip(), panel["title"]


# -- Prometheus files, checked by promtool ------------------------------------------------------------------------
def test_promtool_accepts_the_prometheus_config_and_its_alert_rules(promtool, tmp_path):
    """promtool checks the files a config names exist: the scrape key, a compose secret, is given a stand-in."""
    shutil.copytree(DEPLOY / "prometheus", tmp_path, dirs_exist_ok=True)
    config = tmp_path / "prometheus.yml"
    (tmp_path / "scrape-key").write_text("sk-stand-in\n")
    config.write_text(config.read_text().replace(SCRAPE_KEY_FILE, str(tmp_path / "scrape-key")))
    for check, path in (("config", config), ("rules", tmp_path / "alerts.yml")):
        result = subprocess.run([promtool, "check", check, str(path)], capture_output=True, text=True)
        assert result.returncode == 0, result.stdout + result.stderr


def test_prometheus_scrapes_with_the_scrape_key_compose_gives_it():
    compose = load_yaml(DEPLOY / "compose.yaml")
    [job] = load_yaml(DEPLOY / "prometheus" / "prometheus.yml")["scrape_configs"]
    assert job["authorization"] == {"type": "Bearer", "credentials_file": SCRAPE_KEY_FILE}
    secret = SCRAPE_KEY_FILE.removeprefix("/run/secrets/")
    assert secret in compose["services"]["prometheus"]["secrets"]
    assert compose["secrets"][secret] == {"environment": "INFERNO_SCRAPE_KEY"}


# -- Kubernetes ---------------------------------------------------------------------------------------------------
def test_every_builtin_object_is_valid_against_the_kubernetes_schema():
    """Strict: an unknown or misplaced field is an error, as `kubectl apply --validate=strict` would make it.
    ServiceMonitor (prometheus-operator's) and the Kustomization have no built-in schema."""
    import kubernetes_validate as validate

    checked = []
    for path in sorted(K8S.glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            if document and document["kind"] not in ("Kustomization", "ServiceMonitor"):
                validate.validate(document, validate.latest_version(), strict=True)
                checked.append(document["kind"])
    assert {"Deployment", "Job", "Service", "HorizontalPodAutoscaler", "NetworkPolicy"} <= set(checked)


def test_kustomization_lists_files_that_exist():
    kustomization = load_yaml(K8S / "kustomization.yaml")
    for resource in kustomization["resources"]:
        assert (K8S / resource).is_file(), resource


def test_deployment_requests_a_gpu_and_probes_health_and_readiness(k8s):
    server = container(k8s)
    assert server["resources"]["limits"]["nvidia.com/gpu"] >= 1
    ports = {port["name"]: port["containerPort"] for port in server["ports"]}
    assert ports["http"] == int(env_of(server)["INFERNO_PORT"])
    assert env_of(server)["INFERNO_HOST"] == "0.0.0.0"
    assert server["livenessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert server["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "http"}


def test_termination_grace_covers_prestop_drain_and_worker_stop(k8s):
    server = container(k8s)
    [sleep_s] = [int(word) for word in server["lifecycle"]["preStop"]["exec"]["command"] if word.isdigit()]
    drain_s = float(env_of(server)["INFERNO_DRAIN_TIMEOUT_S"])
    assert drain_s == DRAIN_TIMEOUT_S
    grace = k8s["Deployment"]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace > sleep_s + drain_s + FAREWELL_S + ServerConfig().worker.stop_timeout_s


def test_engines_volume_is_mounted_where_the_server_reads_engines(k8s):
    pod = k8s["Deployment"]["spec"]["template"]["spec"]
    server = container(k8s)
    [mount] = [m for m in server["volumeMounts"] if m["mountPath"] == env_of(server)["INFERNO_ENGINES_DIR"]]
    [volume] = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert volume["persistentVolumeClaim"]["claimName"] == k8s["PersistentVolumeClaim"]["metadata"]["name"]
    assert mount["readOnly"] is True


def test_service_and_servicemonitor_reach_the_pods_metrics(k8s):
    pod_labels = k8s["Deployment"]["spec"]["template"]["metadata"]["labels"]
    service = k8s["Service"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    [port] = service["spec"]["ports"]
    assert port["targetPort"] == "http"
    monitor = k8s["ServiceMonitor"]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    [endpoint] = monitor["spec"]["endpoints"]
    assert (endpoint["port"], endpoint["path"]) == (port["name"], "/metrics")
    assert endpoint["authorization"] == {"type": "Bearer", "credentials": {"name": "inferno-scrape-key", "key": "key"}}


def test_hpa_scales_the_deployment_on_the_queue_depth_the_adapter_serves(k8s):
    hpa = k8s["HorizontalPodAutoscaler"]
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"]["name"] == k8s["Deployment"]["metadata"]["name"]
    [metric] = hpa["spec"]["metrics"]
    assert metric["type"] == "Pods"
    name = metric["pods"]["metric"]["name"]
    assert name == "inferno_requests_waiting"  # the server's queue-depth gauge (docs/metrics.md)
    [rule] = load_yaml(K8S / "prometheus-adapter" / "values.yaml")["rules"]["custom"]
    assert rule["seriesQuery"].startswith(f"{name}{{") and rule["name"]["as"] == name


def test_engine_build_job_writes_the_engines_volume_on_a_gpu():
    job = load_yaml(K8S / "engine-build-job.yaml")
    [build] = job["spec"]["template"]["spec"]["containers"]
    assert build["args"][0] == "build"
    assert build["resources"]["limits"]["nvidia.com/gpu"] >= 1
    [volume] = [v for v in job["spec"]["template"]["spec"]["volumes"] if v["name"] == "engines"]
    assert volume["persistentVolumeClaim"]["claimName"] == "inferno-engines"


def test_engine_build_job_fetches_into_the_checkpoints_volume_and_the_pods_wait_for_its_engine(k8s):
    job = load_yaml(K8S / "engine-build-job.yaml")["spec"]["template"]["spec"]
    [build] = job["containers"]
    env = {item["name"]: item for item in build["env"]}
    mounts = {mount["name"]: mount["mountPath"] for mount in build["volumeMounts"]}
    claims = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in job["volumes"] if "persistentVolumeClaim" in v}
    assert env["HF_HOME"]["value"].startswith(mounts["checkpoints"] + "/")  # the cache is on the volume
    assert claims["checkpoints"] == load_yaml(K8S / "checkpoints-pvc.yaml")["metadata"]["name"]
    assert env["HF_HUB_OFFLINE"]["value"] in ("0", "1")
    assert env["HF_TOKEN"]["valueFrom"]["secretKeyRef"]["optional"] is True
    assert build["args"][-1] == mounts["engines"]
    pod = k8s["Deployment"]["spec"]["template"]["spec"]
    [wait] = pod["initContainers"]
    [server_mount] = [m for m in container(k8s)["volumeMounts"] if m["name"] == "engines"]
    [wait_mount] = wait["volumeMounts"]
    assert wait_mount["name"] == "engines" and wait_mount["mountPath"] == server_mount["mountPath"]
    assert f"{wait_mount['mountPath']}/*/engine.json" in wait["command"][-1]
    assert claims["engines"] == next(v for v in pod["volumes"] if v["name"] == "engines")["persistentVolumeClaim"]["claimName"]


def test_compose_build_service_matches_the_build_job():
    service = load_yaml(DEPLOY / "compose.gpu.yaml")["services"]["build-engine"]
    assert service["profiles"] == ["build"]  # `up` does not start it
    assert service["command"][0] == "build" and service["command"][-2:] == ["--engines-dir", "/engines"]
    home = service["environment"]["HF_HOME"]
    assert any(volume.endswith(":" + home) for volume in service["volumes"])
    served = load_yaml(DEPLOY / "compose.gpu.yaml")["services"]["inferno"]["volumes"]
    assert [v for v in service["volumes"] if v.endswith(":/engines")] == [v for v in served if v.endswith(":/engines")]
