"""deploy/ is safe to expose as shipped: the images run unprivileged and read a keys file that ships empty, so
no deployment here can start open (the server refuses to listen beyond loopback without keys); compose publishes
its ports on loopback and takes Grafana's admin password from the environment; the Kubernetes Deployment runs
non-root on a read-only root filesystem without capabilities, its keys in a Secret, behind a NetworkPolicy."""

from __future__ import annotations

import posixpath
import re

import pytest

from orchestrator.access.keys import KeysError, load_keys, refuse_open_exposure
from orchestrator.config import AuthConfig
from tests.observability.conftest import DEPLOY
from tests.observability.test_deploy_files import K8S, container, dockerfile, env_of, k8s_objects, load_yaml

KEYS_PATH = "/etc/inferno/keys.toml"


@pytest.fixture(scope="module")
def k8s() -> dict[str, dict]:
    return k8s_objects()


@pytest.mark.parametrize("name", ["cpu.Dockerfile", "gpu.Dockerfile"])
def test_images_run_unprivileged_and_read_their_keys_file(name):
    text = dockerfile(name)
    users = re.findall(r"^USER (\S+)", text, re.MULTILINE)
    assert users and users[-1] not in ("root", "0")
    assert text.index(f"USER {users[-1]}") < text.index("ENTRYPOINT")
    assert f"INFERNO_AUTH__KEYS_FILE={KEYS_PATH}" in text


@pytest.mark.parametrize("keys_file", [DEPLOY / "keys.toml", K8S / "keys.toml"])
def test_the_shipped_keys_files_hold_no_key_so_nothing_starts_open(keys_file):
    keys = load_keys(AuthConfig(keys_file=keys_file), [])
    assert not keys.configured
    with pytest.raises(KeysError, match=r"--auth\.allow-open"):
        refuse_open_exposure("0.0.0.0", keys)


def test_compose_publishes_on_loopback_mounts_the_keys_and_asks_for_grafanas_password():
    services = load_yaml(DEPLOY / "compose.yaml")["services"]
    for name, service in services.items():
        assert all(str(port).startswith("127.0.0.1:") for port in service.get("ports", [])), name
    assert f"./keys.toml:{KEYS_PATH}:ro" in services["inferno"]["volumes"]
    password = services["grafana"]["environment"]["GF_SECURITY_ADMIN_PASSWORD"]
    assert re.fullmatch(r"\$\{GRAFANA_ADMIN_PASSWORD:\?.+\}", password)  # compose refuses to start without it


def test_deployment_runs_non_root_read_only_without_capabilities(k8s):
    pod = k8s["Deployment"]["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
    context = container(k8s)["securityContext"]
    assert context["readOnlyRootFilesystem"] is True and context["allowPrivilegeEscalation"] is False
    assert context["capabilities"]["drop"] == ["ALL"]
    job = load_yaml(K8S / "engine-build-job.yaml")["spec"]["template"]["spec"]
    assert job["securityContext"]["runAsNonRoot"] is True


def test_every_path_the_server_writes_is_a_volume_and_the_keys_come_from_the_secret(k8s):
    pod, server = k8s["Deployment"]["spec"]["template"]["spec"], container(k8s)
    env = env_of(server)
    mounts = {m["mountPath"]: m for m in server["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    for path in (env["INFERNO_DATA_DIR"], env["HOME"], "/tmp"):
        assert "emptyDir" in volumes[mounts[path]["name"]], path
    keys_mount = mounts[posixpath.dirname(env["INFERNO_AUTH__KEYS_FILE"])]
    secret = volumes[keys_mount["name"]]["secret"]["secretName"]
    kustomization = load_yaml(K8S / "kustomization.yaml")
    [generated] = [g for g in kustomization["secretGenerator"] if g["name"] == secret]
    assert generated["files"] == [posixpath.basename(env["INFERNO_AUTH__KEYS_FILE"])]
    assert generated["options"]["disableNameSuffixHash"] is True and keys_mount["readOnly"] is True


def test_a_network_policy_admits_only_the_api_port_to_the_pods(k8s):
    policy = k8s["NetworkPolicy"]
    assert "networkpolicy.yaml" in load_yaml(K8S / "kustomization.yaml")["resources"]
    pod_labels = k8s["Deployment"]["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert set(policy["spec"]["policyTypes"]) == {"Ingress", "Egress"}
    named = {port["name"] for port in container(k8s)["ports"]}
    for rule in policy["spec"]["ingress"]:
        assert {port["port"] for port in rule["ports"]} <= named
