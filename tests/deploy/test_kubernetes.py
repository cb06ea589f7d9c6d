"""deploy/kubernetes/, checked offline: the Kubernetes schemas, then what no schema can know.

Every manifest is validated with kubernetes-validate (the Kubernetes API's own JSON schemas,
shipped in the package; strict, so a misspelt field fails) for the oldest Kubernetes the
manifests need (1.30: the preStop ``sleep`` action) and a current one. The ServiceMonitor is
the Prometheus Operator's CRD, which those schemas do not hold: its shape is checked here.

Then the numbers and names that must agree with the rest of the project: the probes' paths
are routes of openapi.yaml, the port and the user are the Dockerfile's, preStop + drain +
gunicorn's graceful_timeout fit in the termination grace period, every TOKEN_SERVICE_*
variable is a setting (token_service.config's own list), the Secret holds exactly the keys
the Deployment reads, and the objects select and name each other.

Each check is a function returning its problems, so ``test_a_broken_manifest_is_caught``
can break a copy of the manifests one way at a time and see the check say so.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.support.dockerfile import graceful_timeout_seconds, runtime_image
from tests.support.docs import code_blocks
from tests.support.edge_timeouts import edge_timeout_seconds
from tests.support.processes import REPO_ROOT
from token_service import config
from token_service.server import granian_serve

MANIFEST_DIR = REPO_ROOT / "deploy" / "kubernetes"
# 1.30: the first release with the preStop sleep action on by default; 1.33: a current one
KUBERNETES_VERSIONS = ("1.30.0", "1.33.0")
# not applied by `kubectl apply -k`: the CRD needs the Prometheus Operator, the Secret is an example
OPTIONAL_FILES = {"servicemonitor.yaml", "secret.example.yaml"}
# the job name deploy/prometheus/token-service.rules.yml reads (up{job="token-service"})
PROMETHEUS_JOB = "token-service"
# seconds left for the kubelet after preStop + drain + graceful: a process that takes its whole
# graceful timeout still gets to exit before the SIGKILL
GRACE_MARGIN_SECONDS = 5
# Resident memory measured for docs/kubernetes.md ("Sizing"): the gunicorn master and one gevent
# worker, idle and under load alike; the pod's memory request must hold the master and its workers.
MASTER_RSS_MIB = 40
WORKER_RSS_MIB = 52
_QUANTITY_UNITS = {
    "": 1,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "m": 10**-3,
}

Manifests = dict[str, list[dict[str, Any]]]  # file name → its documents


def load_manifests() -> Manifests:
    """A fresh copy each time: the breakage tests change theirs."""
    return copy.deepcopy(_parsed_manifests())


@functools.cache
def _parsed_manifests() -> Manifests:
    return {
        path.name: [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]
        for path in sorted(MANIFEST_DIR.glob("*.yaml"))
    }


def one(manifests: Manifests, kind: str) -> dict[str, Any]:
    found = [
        doc
        for docs in manifests.values()
        for doc in docs
        if doc.get("kind") == kind and doc.get("apiVersion") != "kustomize.config.k8s.io/v1beta1"
    ]
    assert len(found) == 1, f"exactly one {kind} in {MANIFEST_DIR}"
    return found[0]


def pod_spec(manifests: Manifests) -> dict[str, Any]:
    spec: dict[str, Any] = one(manifests, "Deployment")["spec"]["template"]["spec"]
    return spec


def container(manifests: Manifests) -> dict[str, Any]:
    containers = pod_spec(manifests)["containers"]
    assert len(containers) == 1
    found: dict[str, Any] = containers[0]
    return found


@functools.cache
def openapi_paths() -> frozenset[str]:
    document = yaml.safe_load((REPO_ROOT / "openapi.yaml").read_text())
    return frozenset(document["paths"])


def plain_env(manifests: Manifests) -> dict[str, str]:
    return {item["name"]: item["value"] for item in container(manifests).get("env", []) if "value" in item}


def named_port(manifests: Manifests, port: int | str) -> int | None:
    for entry in container(manifests).get("ports", []):
        if port in (entry.get("name"), entry["containerPort"]):
            return int(entry["containerPort"])
    return None


# --- the checks: each returns its problems ------------------------------------------------------


def schema_problems(manifests: Manifests, version: str) -> list[str]:
    problems = []
    for name, docs in manifests.items():
        for doc in docs:
            api_version = str(doc.get("apiVersion", ""))
            if api_version.startswith(("kustomize.config.k8s.io/", "monitoring.coreos.com/")):
                continue  # no schema in Kubernetes: kustomization_problems, service_monitor_problems
            error = schema_error(json.dumps(doc, sort_keys=True), version)
            if error:
                problems.append(f"{name}: {error}")
    return problems


@functools.cache
def schema_error(document: str, version: str) -> str | None:
    """The schema's complaint about one document (JSON text, so that the unchanged documents of
    the breakage tests are validated once: each validation loads the whole schema anew)."""
    doc = json.loads(document)
    try:
        kubernetes_validate.validate(doc, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        where = "/".join(str(part) for part in exc.absolute_path)
        return f"{doc.get('kind')} at {where or '(top)'}: {exc.message}"
    except kubernetes_validate.SchemaNotFoundError as exc:
        return str(exc.message)
    return None


def service_monitor_problems(manifests: Manifests) -> list[str]:
    """The Prometheus Operator's ServiceMonitor (a CRD): its shape, and that it finds the Service."""
    monitor = one(manifests, "ServiceMonitor")
    service = one(manifests, "Service")
    problems = []
    if monitor.get("apiVersion") != "monitoring.coreos.com/v1":
        problems.append(f"ServiceMonitor apiVersion {monitor.get('apiVersion')!r}")
    spec = monitor.get("spec", {})
    unknown = set(spec) - {"selector", "endpoints", "namespaceSelector", "jobLabel", "targetLabels"}
    if unknown:
        problems.append(f"ServiceMonitor spec fields unknown here: {sorted(unknown)}")
    wanted = spec.get("selector", {}).get("matchLabels", {})
    labels = service["metadata"].get("labels", {})
    if not wanted or any(labels.get(key) != value for key, value in wanted.items()):
        problems.append(f"the ServiceMonitor selects {wanted}, the Service is labelled {labels}")
    port_names = {port.get("name") for port in service["spec"]["ports"]}
    endpoints = spec.get("endpoints", [])
    if not endpoints:
        problems.append("the ServiceMonitor has no endpoints")
    for endpoint in endpoints:
        if set(endpoint) - {"port", "path", "interval", "scrapeTimeout", "scheme"}:
            problems.append(f"ServiceMonitor endpoint fields unknown here: {sorted(endpoint)}")
        if endpoint.get("port") not in port_names:
            problems.append(f"the ServiceMonitor scrapes port {endpoint.get('port')!r}, not a Service port")
        if endpoint.get("path", "/metrics") != "/metrics":
            problems.append(f"the ServiceMonitor scrapes {endpoint.get('path')}, not /metrics")
        if not re.fullmatch(r"\d+[sm]", str(endpoint.get("interval", "30s"))):
            problems.append(f"ServiceMonitor interval {endpoint.get('interval')!r} is not a duration")
    # without jobLabel the job is the Service's name: the one the alert rules read
    if "jobLabel" in spec or service["metadata"]["name"] != PROMETHEUS_JOB:
        problems.append(f"the scrape job must be {PROMETHEUS_JOB!r} (the rules' job)")
    return problems


def probe_problems(manifests: Manifests) -> list[str]:
    main = container(manifests)
    routes = openapi_paths()
    expected = {"startupProbe": "/healthz", "livenessProbe": "/healthz", "readinessProbe": "/readyz"}
    problems = []
    for probe, path in expected.items():
        get = main.get(probe, {}).get("httpGet")
        if not get:
            problems.append(f"no {probe} with httpGet")
            continue
        if get["path"] not in routes:
            problems.append(f"{probe} asks {get['path']}, which openapi.yaml does not have")
        elif get["path"] != path:
            problems.append(f"{probe} asks {get['path']}, not {path}")
        if named_port(manifests, get["port"]) is None:
            problems.append(f"{probe} asks port {get['port']!r}, which the container does not declare")
    return problems


def port_problems(manifests: Manifests) -> list[str]:
    image_port = runtime_image().port
    problems = []
    ports = container(manifests).get("ports", [])
    if [port["containerPort"] for port in ports] != [image_port]:
        problems.append(f"container ports {ports}: the image listens on PORT={image_port} only")
    if plain_env(manifests).get("PORT", str(image_port)) != str(image_port):
        problems.append("PORT is set to another port than the container's")
    annotations = one(manifests, "Deployment")["spec"]["template"]["metadata"].get("annotations", {})
    if annotations.get("prometheus.io/port") != str(image_port):
        problems.append(f"prometheus.io/port is {annotations.get('prometheus.io/port')!r}, not {image_port}")
    if annotations.get("prometheus.io/path") != "/metrics" or "/metrics" not in openapi_paths():
        problems.append("prometheus.io/path must be /metrics")
    service = one(manifests, "Service")
    for port in service["spec"]["ports"]:
        if named_port(manifests, port["targetPort"]) != image_port:
            problems.append(f"the Service's targetPort {port['targetPort']!r} is not the container's port")
    return problems


def timing_problems(manifests: Manifests) -> list[str]:
    """preStop, then SIGTERM: drain (/readyz 503), then gunicorn's graceful stop; all before SIGKILL."""
    main = container(manifests)
    problems = []
    pre_stop = main.get("lifecycle", {}).get("preStop", {})
    if "sleep" in pre_stop:
        pre_stop_seconds = int(pre_stop["sleep"]["seconds"])
    elif pre_stop.get("exec", {}).get("command", [])[:1] == ["sleep"]:
        pre_stop_seconds = int(pre_stop["exec"]["command"][1])
    else:
        problems.append(f"preStop {pre_stop}: a sleep, so the endpoints' update reaches every proxy")
        pre_stop_seconds = 0
    env = {**runtime_image().env, **plain_env(manifests)}
    drain = "TOKEN_SERVICE_DRAIN_SECONDS"  # as the pod gets it: the image's, unless the manifest sets it
    drain_seconds = config.Settings.from_env({drain: env[drain]} if drain in env else {}).drain_seconds
    if drain_seconds < 1:
        problems.append("TOKEN_SERVICE_DRAIN_SECONDS is 0: /readyz never fails before the stop")
    if "GUNICORN_CMD_ARGS" in env or "command" in main or "args" in main:
        problems.append(
            "gunicorn's settings are overridden: the graceful timeout checked here is not in force"
        )
    # the server's graceful stop: gunicorn's graceful_timeout, or granian's --workers-kill-timeout
    server = config.Settings.from_env({k: v for k, v in env.items() if k == "TOKEN_SERVICE_SERVER"}).server
    graceful_seconds = (
        granian_serve.WORKERS_KILL_TIMEOUT_SECONDS if server == "granian" else graceful_timeout_seconds()
    )
    total = pre_stop_seconds + drain_seconds + graceful_seconds
    grace = pod_spec(manifests).get("terminationGracePeriodSeconds", 30)
    if total + GRACE_MARGIN_SECONDS > grace:
        problems.append(
            f"preStop {pre_stop_seconds} s + drain {drain_seconds} s + graceful {graceful_seconds} s"
            f" + {GRACE_MARGIN_SECONDS} s does not fit terminationGracePeriodSeconds {grace}"
        )
    return problems


def security_problems(manifests: Manifests) -> list[str]:
    image = runtime_image()
    pod = pod_spec(manifests)
    main = container(manifests)
    pod_context = pod.get("securityContext", {})
    context = {**pod_context, **main.get("securityContext", {})}
    expected: dict[str, Any] = {
        "runAsNonRoot": True,
        "runAsUser": image.uid,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    if image.gid is not None:
        expected["runAsGroup"] = image.gid
    problems = [
        f"securityContext {key}: {context.get(key)!r}, expected {value!r}"
        for key, value in expected.items()
        if context.get(key) != value
    ]
    volumes = {volume["name"]: volume for volume in pod.get("volumes", [])}
    tmp = [mount for mount in main.get("volumeMounts", []) if mount["mountPath"] == "/tmp"]
    if not tmp or "emptyDir" not in volumes.get(tmp[0]["name"], {}):
        problems.append("a read-only root needs an emptyDir on /tmp (the image's WORKDIR, tempfile)")
    return problems


def environment_problems(manifests: Manifests) -> list[str]:
    main = container(manifests)
    problems = []
    if "envFrom" in main:
        problems.append("envFrom: every variable is named in env, so its name can be checked")
    names = {item["name"]: "" for item in main.get("env", [])}
    problems += config.unknown_variables(names)
    try:
        settings = config.Settings.from_env(plain_env(manifests))
    except config.ConfigError as exc:
        problems.append(str(exc))
        settings = config.Settings()
    if pod_spec(manifests).get("enableServiceLinks", True):
        # what Kubernetes would add for the Service: TOKEN_SERVICE_PORT, TOKEN_SERVICE_SERVICE_HOST, ...
        service = one(manifests, "Service")["metadata"]["name"].upper().replace("-", "_")
        links = {f"{service}_SERVICE_HOST": "", f"{service}_PORT": ""}
        problems += [f"enableServiceLinks: {message}" for message in config.unknown_variables(links)]
    workers = plain_env(manifests).get("WEB_CONCURRENCY", "")
    if not workers.isdigit():
        problems.append("WEB_CONCURRENCY unset: gunicorn would start one worker per core of the node")
    else:
        problems += sizing_problems(manifests, int(workers))
    hops = settings.trusted_proxy_hops
    if any(doc.get("kind") == "Ingress" for docs in manifests.values() for doc in docs) and hops != 1:
        problems.append(f"TOKEN_SERVICE_TRUSTED_PROXY_HOPS={hops}, with one Ingress in front")
    # the image's command binds 0.0.0.0: what `serve --server granian` would refuse, the pod would too
    if settings.server == "granian":
        if refused := granian_serve.exposure_refused(settings, "0.0.0.0"):
            problems.append(refused)
        ingress = one(manifests, "Ingress")["metadata"].get("annotations", {})
        if ingress.get("nginx.ingress.kubernetes.io/proxy-request-buffering", "on") != "on":
            problems.append("granian behind an Ingress that passes bodies on as they come: no body deadline")
    return problems


def quantity(value: str | int) -> float:
    """A Kubernetes quantity (``192Mi``, ``500m``, ``2``) as a number of bytes or cores."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([KMG]i|[kMGm]?)", str(value))
    assert match, f"not a quantity this check reads: {value!r}"
    return float(match.group(1)) * _QUANTITY_UNITS[match.group(2)]


def sizing_problems(manifests: Manifests, workers: int) -> list[str]:
    resources = container(manifests).get("resources", {})
    requests, limits = resources.get("requests", {}), resources.get("limits", {})
    problems = []
    needed_mib = MASTER_RSS_MIB + WORKER_RSS_MIB * workers
    if "memory" in requests and quantity(requests["memory"]) < needed_mib * 2**20:
        problems.append(
            f"a memory request of {requests['memory']} is below {needed_mib} MiB for {workers} workers"
        )
    if "memory" in limits and quantity(limits["memory"]) < 2 * needed_mib * 2**20:
        problems.append(f"a memory limit of {limits['memory']} leaves no room over {needed_mib} MiB")
    if "cpu" in limits and quantity(limits["cpu"]) < workers:
        problems.append(
            f"{workers} workers share a CPU limit of {limits['cpu']}: each worker gets less than a core"
        )
    return problems


def secret_problems(manifests: Manifests) -> list[str]:
    secret = one(manifests, "Secret")
    held = set(secret.get("stringData", {})) | set(secret.get("data", {}))
    read = {
        item["valueFrom"]["secretKeyRef"]["key"]
        for item in container(manifests).get("env", [])
        if "secretKeyRef" in item.get("valueFrom", {})
        and item["valueFrom"]["secretKeyRef"]["name"] == secret["metadata"]["name"]
    }
    problems = []
    if read - held:
        problems.append(f"the Deployment reads {sorted(read - held)}, which the Secret does not hold")
    if held - read:
        problems.append(f"the Secret holds {sorted(held - read)}, which the Deployment never reads")
    refs = {
        item["valueFrom"]["secretKeyRef"]["name"]
        for item in container(manifests).get("env", [])
        if "secretKeyRef" in item.get("valueFrom", {})
    }
    if refs != {secret["metadata"]["name"]}:
        problems.append(
            f"the Deployment reads Secrets {sorted(refs)}, the example is {secret['metadata']['name']}"
        )
    secret_env = {
        item["name"]
        for item in container(manifests).get("env", [])
        if "secretKeyRef" in item.get("valueFrom", {})
    }
    for name in ("TOKEN_SERVICE_REDIS_URL", "TOKEN_SERVICE_API_KEYS", "TOKEN_SERVICE_ADMIN_KEYS"):
        if name not in secret_env:
            problems.append(f"{name} is not read from the Secret")
    # the example must not run as it is: its change-me values are refused at start
    by_key = {
        item["valueFrom"]["secretKeyRef"]["key"]: item["name"]
        for item in container(manifests).get("env", [])
        if "secretKeyRef" in item.get("valueFrom", {})
    }
    values = {by_key[key]: value for key, value in secret.get("stringData", {}).items() if key in by_key}
    try:
        config.Settings.from_env(values)
        problems.append("the example Secret's values would start the service: they must be refused")
    except config.ConfigError:
        pass
    if "change me" not in (MANIFEST_DIR / "secret.example.yaml").read_text().lower():
        problems.append("secret.example.yaml must say CHANGE ME")
    return problems


def wiring_problems(manifests: Manifests) -> list[str]:
    """The objects find each other: selectors, names, ports."""
    deployment = one(manifests, "Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    problems = []

    def selects(selector: dict[str, Any], what: str) -> None:
        wanted = selector.get("matchLabels", selector)
        if not wanted or any(pod_labels.get(key) != value for key, value in wanted.items()):
            problems.append(f"the {what} selects {wanted}, the pods are labelled {pod_labels}")

    selects(deployment["spec"]["selector"], "Deployment")
    selects(one(manifests, "Service")["spec"]["selector"], "Service")
    selects(one(manifests, "PodDisruptionBudget")["spec"]["selector"], "PodDisruptionBudget")
    hpa = one(manifests, "HorizontalPodAutoscaler")
    target = hpa["spec"]["scaleTargetRef"]
    if (target["kind"], target["name"]) != ("Deployment", deployment["metadata"]["name"]):
        problems.append(f"the HorizontalPodAutoscaler scales {target}")
    if "replicas" in deployment["spec"]:
        problems.append("the Deployment sets replicas: each apply would undo the autoscaler's count")
    if hpa["spec"].get("minReplicas", 1) < 2:
        problems.append("minReplicas below 2: a single pod leaves the PodDisruptionBudget nothing to keep")
    cpu_metrics = [
        metric for metric in hpa["spec"].get("metrics", []) if metric.get("resource", {}).get("name") == "cpu"
    ]
    if not cpu_metrics:
        problems.append("the HorizontalPodAutoscaler does not scale on CPU")
    if "cpu" not in container(manifests).get("resources", {}).get("requests", {}):
        problems.append("no CPU request: the autoscaler's utilization has nothing to divide by")
    for kind in ("memory", "cpu"):
        if kind not in container(manifests).get("resources", {}).get("limits", {}):
            problems.append(f"no {kind} limit")
    rollout = deployment["spec"].get("strategy", {}).get("rollingUpdate", {})
    if rollout.get("maxUnavailable") != 0:
        problems.append("a rollout may take a pod down before its replacement is ready (maxUnavailable)")
    service = one(manifests, "Service")
    service_ports = {port.get("name") for port in service["spec"]["ports"]}
    routes = openapi_paths()
    for rule in one(manifests, "Ingress")["spec"]["rules"]:
        for path in rule["http"]["paths"]:
            backend = path["backend"]["service"]
            if (
                backend["name"] != service["metadata"]["name"]
                or backend["port"].get("name") not in service_ports
            ):
                problems.append(f"the Ingress sends {path['path']} to {backend}, not to the Service")
            matching = [route for route in routes if route == path["path"] or route.startswith(path["path"])]
            if not matching:
                problems.append(f"the Ingress routes {path['path']}, which openapi.yaml does not have")
            if path["pathType"] == "Prefix" and any(
                route in ("/metrics", "/healthz", "/readyz") or route.startswith("/admin")
                for route in routes
                if route.startswith(path["path"])
            ):
                problems.append(f"the Ingress routes {path['path']}: it exposes an operations route")
            if path["path"] in ("/metrics", "/healthz", "/readyz") or path["path"].startswith("/admin"):
                problems.append(f"the Ingress exposes {path['path']}")
    return problems


def kustomization_problems(manifests: Manifests) -> list[str]:
    kustomization = manifests["kustomization.yaml"][0]
    problems = []
    resources = kustomization.get("resources", [])
    missing = [name for name in resources if not (MANIFEST_DIR / name).is_file()]
    if missing:
        problems.append(f"kustomization.yaml lists {missing}, which do not exist")
    left_out = set(manifests) - set(resources) - OPTIONAL_FILES - {"kustomization.yaml"}
    if left_out:
        problems.append(f"kustomization.yaml leaves out {sorted(left_out)}")
    if set(resources) & OPTIONAL_FILES:
        problems.append(f"kustomization.yaml applies {sorted(set(resources) & OPTIONAL_FILES)}")
    image_name = container(manifests)["image"].split(":")[0]
    if [image["name"] for image in kustomization.get("images", [])] != [image_name]:
        problems.append(f"kustomization.yaml's images do not name the Deployment's image {image_name}")
    return problems


def budget_problems(manifests: Manifests) -> list[str]:
    """The readiness probe and the Ingress wait for the service's Redis budget per request, + 2 s.

    /readyz asks Redis: a probe that gives up first never reads the service's 503, and an
    Ingress that does turns it into a 504. Set from the settings the pod gets (the Redis URL is
    the Secret's: a standalone or Sentinel one, as docs/kubernetes.md has it).
    """
    expected = edge_timeout_seconds({**runtime_image().env, **plain_env(manifests)})
    problems = []
    readiness = container(manifests).get("readinessProbe", {}).get("timeoutSeconds", 1)
    if readiness != expected:
        problems.append(f"readinessProbe timeoutSeconds {readiness}: the Redis budget + 2 s is {expected}")
    annotations = one(manifests, "Ingress")["metadata"].get("annotations", {})
    read_timeout = annotations.get("nginx.ingress.kubernetes.io/proxy-read-timeout")
    if read_timeout != str(expected):
        problems.append(
            f"the Ingress's proxy-read-timeout {read_timeout!r}: the Redis budget + 2 s is {expected}"
        )
    return problems


SEMANTIC_CHECKS: list[Callable[[Manifests], list[str]]] = [
    service_monitor_problems,
    probe_problems,
    budget_problems,
    port_problems,
    timing_problems,
    security_problems,
    environment_problems,
    secret_problems,
    wiring_problems,
    kustomization_problems,
]


def semantic_problems(manifests: Manifests) -> list[str]:
    return [problem for check in SEMANTIC_CHECKS for problem in check(manifests)]


# --- the tests ------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_manifest_is_valid_for_kubernetes(version: str) -> None:
    manifests = load_manifests()
    kinds = sorted(str(doc["kind"]) for docs in manifests.values() for doc in docs)
    assert kinds == sorted(
        [
            "Deployment",
            "HorizontalPodAutoscaler",
            "Ingress",
            "Kustomization",
            "PodDisruptionBudget",
            "Secret",
            "Service",
            "ServiceMonitor",
        ]
    )
    assert schema_problems(manifests, version) == []


@pytest.mark.parametrize("check", SEMANTIC_CHECKS, ids=lambda check: check.__name__)
def test_the_manifests_agree_with_the_image_the_config_and_each_other(
    check: Callable[[Manifests], list[str]],
) -> None:
    assert check(load_manifests()) == []


def env_item(manifests: Manifests, name: str) -> dict[str, Any]:
    return next(item for item in container(manifests)["env"] if item["name"] == name)


# Each breaks one thing a reader could get wrong; the substring is what the problem must mention.
BREAKAGES: dict[str, tuple[Callable[[Manifests], None], str]] = {
    "misspelt field": (
        lambda m: container(m)["livenessProbe"]["httpGet"].update(paht="/healthz"),
        "paht",
    ),
    "wrong type": (lambda m: container(m)["resources"]["requests"].update(cpu=[1]), "requests/cpu"),
    "probe path not in openapi.yaml": (
        lambda m: container(m)["readinessProbe"]["httpGet"].update(path="/ready"),
        "/ready, which openapi.yaml",
    ),
    "liveness on readiness's route": (
        lambda m: container(m)["livenessProbe"]["httpGet"].update(path="/readyz"),
        "livenessProbe asks /readyz",
    ),
    "another port": (lambda m: container(m)["ports"][0].update(containerPort=8080), "PORT=8000"),
    "short grace period": (lambda m: pod_spec(m).update(terminationGracePeriodSeconds=15), "does not fit"),
    "longer drain": (
        lambda m: env_item(m, "TOKEN_SERVICE_DRAIN_SECONDS").update(value="30"),
        "does not fit",
    ),
    "no preStop": (lambda m: container(m).pop("lifecycle"), "preStop"),
    "readiness shorter than the Redis budget": (
        lambda m: container(m)["readinessProbe"].update(timeoutSeconds=3),
        "readinessProbe timeoutSeconds 3",
    ),
    "a longer Redis timeout, the probe and Ingress left as they were": (
        lambda m: container(m)["env"].append({"name": "TOKEN_SERVICE_REDIS_TIMEOUT_SECONDS", "value": "5"}),
        "the Redis budget + 2 s is 12",
    ),
    "root user": (lambda m: pod_spec(m)["securityContext"].update(runAsUser=0), "runAsUser"),
    "another uid": (lambda m: pod_spec(m)["securityContext"].update(runAsUser=1000), "runAsUser"),
    "writable root": (
        lambda m: container(m)["securityContext"].update(readOnlyRootFilesystem=False),
        "readOnlyRootFilesystem",
    ),
    "capabilities kept": (lambda m: container(m)["securityContext"].pop("capabilities"), "capabilities"),
    "no /tmp": (lambda m: container(m).pop("volumeMounts"), "/tmp"),
    "misspelt setting": (
        lambda m: env_item(m, "TOKEN_SERVICE_DRAIN_SECONDS").update(name="TOKEN_SERVICE_DRAIN_SECONDZ"),
        "TOKEN_SERVICE_DRAIN_SECONDZ: not a setting",
    ),
    "bad setting value": (
        lambda m: env_item(m, "TOKEN_SERVICE_TRUSTED_PROXY_HOPS").update(value="many"),
        "TOKEN_SERVICE_TRUSTED_PROXY_HOPS",
    ),
    "two hops behind one ingress": (
        lambda m: env_item(m, "TOKEN_SERVICE_TRUSTED_PROXY_HOPS").update(value="2"),
        "with one Ingress",
    ),
    "service links on": (
        lambda m: pod_spec(m).pop("enableServiceLinks"),
        "TOKEN_SERVICE_PORT: not a setting",
    ),
    "secret key renamed": (
        lambda m: env_item(m, "TOKEN_SERVICE_API_KEYS")["valueFrom"]["secretKeyRef"].update(key="api-key"),
        "['api-key'], which the Secret does not hold",
    ),
    "usable example secret": (
        lambda m: one(m, "Secret")["stringData"].update(
            {"api-keys": "a-real-looking-key-0123456789", "admin-keys": "another-real-key-0123456789"}
        ),
        "would start the service",
    ),
    "service selects nothing": (
        lambda m: one(m, "Service")["spec"]["selector"].update({"app.kubernetes.io/name": "tokens"}),
        "the Service selects",
    ),
    "monitor misses the service": (
        lambda m: one(m, "ServiceMonitor")["spec"]["endpoints"][0].update(port="metrics"),
        "port 'metrics'",
    ),
    "monitor field misspelt": (
        lambda m: one(m, "ServiceMonitor")["spec"].update(endpoint=[]),
        "unknown here",
    ),
    "replicas pinned": (lambda m: one(m, "Deployment")["spec"].update(replicas=3), "replicas"),
    "metrics exposed": (
        lambda m: one(m, "Ingress")["spec"]["rules"][0]["http"]["paths"][0].update(path="/"),
        "operations route",
    ),
    "ingress to another port": (
        lambda m: one(m, "Ingress")["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"].update(
            port={"name": "web"}
        ),
        "not to the Service",
    ),
    "hpa on another deployment": (
        lambda m: one(m, "HorizontalPodAutoscaler")["spec"]["scaleTargetRef"].update(name="tokens"),
        "scales",
    ),
    "more workers, same memory": (
        lambda m: env_item(m, "WEB_CONCURRENCY").update(value="4"),
        "below 248 MiB for 4 workers",
    ),
    "workers over the CPU limit": (
        lambda m: container(m)["resources"]["limits"].update(cpu="1500m"),
        "each worker gets less than a core",
    ),
    "granian with no proxy declared": (
        lambda m: (
            env_item(m, "TOKEN_SERVICE_SERVER").update(value="granian"),
            container(m)["env"].remove(env_item(m, "TOKEN_SERVICE_TRUSTED_PROXY_HOPS")),
        ),
        "needs a proxy in front of it",
    ),
    "granian behind an unbuffered ingress": (
        lambda m: (
            env_item(m, "TOKEN_SERVICE_SERVER").update(value="granian"),
            one(m, "Ingress")["metadata"]["annotations"].update(
                {"nginx.ingress.kubernetes.io/proxy-request-buffering": "off"}
            ),
        ),
        "no body deadline",
    ),
    "gunicorn overridden": (
        lambda m: container(m)["env"].append({"name": "GUNICORN_CMD_ARGS", "value": "--graceful-timeout 60"}),
        "overridden",
    ),
}


def test_one_setting_selects_granian_behind_the_ingress() -> None:
    """TOKEN_SERVICE_SERVER=granian, nothing else changed: every check still holds (the Ingress is
    the proxy granian needs, already declared by TOKEN_SERVICE_TRUSTED_PROXY_HOPS=1)."""
    manifests = load_manifests()
    assert plain_env(manifests)["TOKEN_SERVICE_SERVER"] == "gunicorn"  # the default, said
    env_item(manifests, "TOKEN_SERVICE_SERVER").update(value="granian")
    assert semantic_problems(manifests) == []
    assert config.Settings.from_env(plain_env(manifests)).server == "granian"


@pytest.mark.parametrize("breakage", sorted(BREAKAGES))
def test_a_broken_manifest_is_caught(breakage: str) -> None:
    manifests = load_manifests()
    mutate, expected = BREAKAGES[breakage]
    mutate(manifests)
    # the schema for what only a schema knows (validating a Deployment takes a second or two)
    schema_only = breakage in ("misspelt field", "wrong type")
    problems = (
        schema_problems(manifests, KUBERNETES_VERSIONS[-1]) if schema_only else semantic_problems(manifests)
    )
    assert any(expected in problem for problem in problems), problems


def test_the_kubernetes_page_names_every_manifest() -> None:
    page = (REPO_ROOT / "docs" / "kubernetes.md").read_text()
    for name in load_manifests():
        assert f"deploy/kubernetes/{name}" in page or f"`{name}`" in page, name
    assert "kubernetes.md" in (REPO_ROOT / "mkdocs.yml").read_text()


def test_the_documented_kubectl_line_creates_the_secret_the_deployment_reads(tmp_path: Path) -> None:
    """docs/kubernetes.md's `kubectl create secret` block, run as written with a kubectl that
    records its arguments: it creates the Secret the Deployment reads, with values the service
    accepts (unlike the example's). secret.example.yaml shows the same command."""
    if shutil.which("openssl") is None:
        message = "openssl is not installed: the kubectl line makes keys with it (apt-get install openssl)"
        if os.environ.get("CI"):
            pytest.fail(message + " — CI must run it", pytrace=False)
        pytest.skip(message)
    blocks = code_blocks("docs/kubernetes.md", "sh")
    block = next(block for block in blocks if "kubectl create secret" in block.code)
    recorded = tmp_path / "argv"
    kubectl = tmp_path / "bin" / "kubectl"
    kubectl.parent.mkdir()
    kubectl.write_text(f'#!/bin/sh\nprintf "%s\\0" "$@" > {recorded}\n')
    kubectl.chmod(0o755)
    env = {**os.environ, "PATH": f"{kubectl.parent}:{os.environ['PATH']}"}
    subprocess.run(["bash", "-euc", block.code], env=env, check=True, timeout=60)
    argv = recorded.read_text().split("\0")[:-1]
    manifests = load_manifests()
    secret = one(manifests, "Secret")
    assert argv[:4] == ["create", "secret", "generic", secret["metadata"]["name"]]
    literals = dict(arg.removeprefix("--from-literal=").split("=", 1) for arg in argv[4:])
    assert set(literals) == set(secret["stringData"])
    by_key = {
        item["valueFrom"]["secretKeyRef"]["key"]: item["name"]
        for item in container(manifests)["env"]
        if "secretKeyRef" in item.get("valueFrom", {})
    }
    settings = config.Settings.from_env({by_key[key]: value for key, value in literals.items()})
    assert settings.api_keys
    assert settings.admin_keys
    assert settings.redis_target.kind == "standalone"
    example = (MANIFEST_DIR / "secret.example.yaml").read_text()
    for key in literals:
        assert f"--from-literal={key}=" in example


def test_the_redis_urls_on_the_kubernetes_page_are_valid() -> None:
    """Each URL the page gives for a topology is one the service accepts, of that topology."""
    page = (REPO_ROOT / "docs" / "kubernetes.md").read_text()
    urls = re.findall(r"`((?:redis|rediss)(?:\+\w+)?://[^`]+)`", page)
    kinds = {config.parse_redis_url(url).kind for url in urls}
    assert kinds == {"standalone", "sentinel", "cluster"}
