"""deploy/compose.yaml, deploy/k8s/, deploy/kserve/, the Prometheus and Grafana files and the
Dockerfile agree with the server: env var names, values, arguments, ports, probes, paths and the
shutdown grace period are checked against `fastformer-server --help` (parsed at test time, see
deploy_flags) and, for the values, by starting the real server with each file's environment
(and arguments) and running each probe of the file against it."""

import json
import re
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

import deploy_flags
import deploy_promql
import deploy_sources

SERVER_SERVICES = ("fastformer", "fastformer-cpu")
REPO = Path(__file__).resolve().parents[2]
HEALTH_PATHS = {"/v2/health/ready": "ready", "/health": "ready", "/v2/health/live": "live"}


# ----------------------------------------------------------------------------- shared checks


def _check_env(flags, env, where):
    """Names the server declares, values within the choices --help lists, numbers where it wants numbers."""
    problems = []
    for name in deploy_flags.unknown_env(flags, env):
        problems.append(f"{where}: {name} is not a fastformer-server variable")
    by_env = deploy_flags.env_names(flags)
    for k, v in env.items():
        f = flags.get(by_env.get(k, ""))
        if f is None:
            continue
        v = str(v)
        if f.choices and v not in f.choices:
            problems.append(f"{where}: {k}={v!r} is not one of {f.choices}")
        if f.type == "INT" and not re.fullmatch(r"-?\d+", v):
            problems.append(f"{where}: {k}={v!r} is not an integer")
        if f.type == "FLOAT" and not re.fullmatch(r"-?\d+(\.\d*)?([eE][+-]?\d+)?", v):
            problems.append(f"{where}: {k}={v!r} is not a number")
    return problems


def _run_with_env(run_server_env, flags, env, where, args=(), while_up=None):
    """The real server starts with env (and args) and reports the values it was given (limits line,
    drain time); while_up(server) runs while it serves."""
    log, ran = run_server_env(env, args, while_up)
    eff = deploy_flags.effective(flags, {**ran, **_args_env(flags, args)})
    m = re.search(r"limits: (.*)", log)
    assert m, f"{where}: no limits line in the server log:\n{log}"
    limits = dict(re.findall(r"([a-z-]+) (\d+)", m.group(1)))
    for name, value in limits.items():
        if name in eff and not (name == "max-request-tokens" and eff[name] == "0"):
            assert value == eff[name], f"{where}: server runs with --{name} {value}, the file sets {eff[name]}"
    drain = re.search(r"draining .*up to ([\d.]+) s", log)
    assert drain, f"{where}: no draining line after SIGTERM:\n{log}"
    assert float(drain.group(1)) == float(eff["shutdown-timeout-s"]), (where, drain.group(0))


def _args_env(flags, args):
    """Command-line arguments as the variables that would set the same flags ({env name: value}),
    so that deploy_flags.effective and _check_env read them; an unknown flag is an error."""
    out, args, i = {}, [str(a) for a in args], 0
    while i < len(args):
        a = args[i]
        assert a.startswith("--"), f"argument {a!r} is not a --flag (the image's ENTRYPOINT is fastformer-server)"
        name, eq, value = a[2:].partition("=")
        assert name in flags, f"--{name} is not a fastformer-server flag"
        if not eq:
            if flags[name].type == "":       # a switch
                value = "true"
            else:
                assert i + 1 < len(args), f"--{name} has no value"
                i += 1
                value = args[i]
        out[flags[name].env] = value
        i += 1
    return out


def _shutdown_timeout(flags, env) -> float:
    return float(deploy_flags.effective(flags, env)["shutdown-timeout-s"])


def _model_source(eff, where):
    """(flag, path): the one of --model-dir / --model-repository the server runs with."""
    given = [(f, eff.get(f)) for f in ("model-dir", "model-repository") if eff.get(f)]
    assert len(given) == 1, f"{where}: the server needs exactly one of --model-dir and --model-repository, gets {given}"
    return given[0]


def _probe_kind(probe):
    """'ready' or 'live': what a probe asks the server (gRPC health "" = ready), else None."""
    if "grpc" in probe:
        return "ready" if probe["grpc"].get("service", "") in ("", "fastformer.v1.Encoder") else None
    if "httpGet" in probe:
        return HEALTH_PATHS.get(probe["httpGet"].get("path"))
    return None


def _probe_port(probe, ports):
    """The container port a probe goes to (a port name resolved through the container's ports)."""
    spec = probe.get("grpc") or probe.get("httpGet") or {}
    port = spec.get("port")
    return ports[port] if isinstance(port, str) else int(port)


def _run_probe(srv, name, probe, container_ports):
    """Runs a manifest's probe as the kubelet would, against srv (ports mapped): passes or fails."""
    local = srv.local_port(_probe_port(probe, container_ports))
    if "grpc" in probe:
        if str(REPO / "client" / "python") not in sys.path:
            sys.path.insert(0, str(REPO / "client" / "python"))
        from fastformer_client import Client
        with Client(f"127.0.0.1:{local}", deadline_s=5) as client:
            status = client.health(probe["grpc"].get("service", ""))
        assert status == "SERVING", f"{name} (gRPC health {probe['grpc']}) on a SERVING server: {status}"
    else:
        url = f"http://127.0.0.1:{local}{probe['httpGet']['path']}"
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                code = r.status
        except urllib.error.HTTPError as e:
            code = e.code
        # the kubelet counts 200-399 as success
        assert 200 <= code < 400, f"{name} GET {probe['httpGet']['path']} on a SERVING server: {code}"


def _image_env(deploy_files):
    """The FASTFORMER_* variables the image's ENV sets: a pod starts with them under its own."""
    env = {}
    for word, rest in _runtime_stage(deploy_files.dockerfile.read_text()):
        if word == "ENV":
            for k, v in re.findall(r"(\w+)=(\"[^\"]*\"|\S+)", rest) or [tuple(rest.split(None, 1))]:
                env[k] = v.strip('"')
    return {k: v for k, v in env.items() if k.startswith("FASTFORMER_")}


# ----------------------------------------------------------------------------- the flag reader itself


def test_help_parser_reads_names_defaults_and_env(flags, help_text):
    assert flags["listen"].env == "FASTFORMER_LISTEN"
    assert deploy_flags.port_of(flags["listen"].default) > 0
    # exactly one of the two is needed, so neither is REQUIRED on its own
    assert flags["model-repository"].env == "FASTFORMER_MODEL_REPOSITORY"
    assert flags["model-control-mode"].default == "none"
    assert flags["backend"].choices and "cpu" in flags["backend"].choices
    # every option line with an Env: annotation was read
    assert len(flags) == help_text.count("(Env:"), sorted(flags)
    assert _check_env(flags, {"FASTFORMER_MAX_BATCH_TOKEN": "1"}, "typo") == \
        ["typo: FASTFORMER_MAX_BATCH_TOKEN is not a fastformer-server variable"]
    assert _check_env(flags, {"FASTFORMER_BACKEND": "gpu"}, "x")
    assert _check_env(flags, {"FASTFORMER_SHUTDOWN_TIMEOUT_S": "30s"}, "x")
    assert deploy_flags.compose_value("${A:-16384}") == "16384"
    assert deploy_flags.duration_seconds("1m30s") == 90


# ----------------------------------------------------------------------------- compose


@pytest.fixture(scope="module")
def compose(deploy_files):
    docs = deploy_sources.load_yaml_docs(deploy_files.compose)
    assert len(docs) == 1 and isinstance(docs[0], dict), "compose.yaml: one YAML mapping"
    return docs[0]


def _compose_env(svc):
    env = svc.get("environment") or {}
    if isinstance(env, list):
        env = dict(e.split("=", 1) for e in env)
    return {k: deploy_flags.compose_value(v) for k, v in env.items()}


def _container_ports(svc):
    out = set()
    for p in svc.get("ports") or []:
        if isinstance(p, dict):
            out.add(int(p["target"]))
        else:
            out.add(int(str(p).split("/")[0].rsplit(":", 1)[-1]))
    return out


def test_compose_services(compose, deploy_files):
    services = compose.get("services") or {}
    for name in SERVER_SERVICES + ("prometheus", "grafana"):
        assert name in services, f"compose.yaml has no service {name!r}"
    gpu, cpu = services["fastformer"], services["fastformer-cpu"]
    # The default service reserves a GPU; the cpu profile's does not.
    assert not gpu.get("profiles"), "the GPU server is the default service (no profile)"
    devices = gpu.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices") or []
    assert any(d.get("driver") == "nvidia" and "gpu" in (d.get("capabilities") or []) for d in devices), devices
    assert cpu.get("profiles") == ["cpu"], cpu.get("profiles")
    assert not cpu.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices")
    args = {k: str(v) for k, v in (cpu["build"].get("args") or {}).items()}
    assert args == {"BUILD_IMAGE": "debian:bookworm", "RUNTIME_IMAGE": "debian:bookworm-slim", "FASTFORMER_CUDA": "OFF"}
    for name in SERVER_SERVICES:
        b = services[name]["build"]
        ctx = (deploy_files.compose.parent / b["context"]).resolve()
        assert (ctx / b.get("dockerfile", "Dockerfile")).is_file(), f"{name}: no Dockerfile at {ctx}"
        assert ctx == deploy_files.repo, f"{name}: build context {ctx} is not the repository"
    # Bind-mounted files and folders exist (relative to compose.yaml).
    for name, svc in services.items():
        for v in svc.get("volumes") or []:
            src = str(v).split(":")[0]
            if src.startswith("./"):
                assert (deploy_files.compose.parent / src).exists(), f"{name}: {src} does not exist"


@pytest.mark.parametrize("service", SERVER_SERVICES)
def test_compose_server_matches_flags(compose, flags, service, run_server_env):
    svc = compose["services"][service]
    env = _compose_env(svc)
    problems = _check_env(flags, env, f"compose {service}")
    assert not problems, "\n".join(problems)
    eff = deploy_flags.effective(flags, env)
    grpc_port = deploy_flags.port_of(eff["listen"])
    metrics_port = deploy_flags.port_of(eff["metrics-listen"])
    assert grpc_port == deploy_flags.port_of(flags["listen"].default) == 50051
    assert metrics_port == deploy_flags.port_of(flags["metrics-listen"].default) == 8002
    http_port = deploy_flags.port_of(eff["http-listen"])
    assert http_port == deploy_flags.port_of(flags["http-listen"].default) == 8000
    assert _container_ports(svc) == {grpc_port, http_port, metrics_port}, svc.get("ports")
    # The model volume is mounted where FASTFORMER_MODEL_DIR points.
    targets = [deploy_flags.compose_value(v).split(":")[1] for v in svc.get("volumes") or []]
    assert eff["model-dir"] in targets, f"model dir {eff['model-dir']} not mounted: {svc.get('volumes')}"
    # Health check: fastformer-client health on the gRPC port.
    test = svc["healthcheck"]["test"]
    assert test[0] == "CMD" and test[1:3] == ["fastformer-client", "health"], test
    assert deploy_flags.port_of(test[test.index("--target") + 1]) == grpc_port, test
    # Docker's SIGKILL must not cut the drain short.
    grace = deploy_flags.duration_seconds(svc.get("stop_grace_period", "10s"))
    assert grace > _shutdown_timeout(flags, env), f"stop_grace_period {grace} s <= shutdown timeout"
    _run_with_env(run_server_env, flags, env, f"compose {service}")


def test_prometheus_scrapes_the_compose_servers(compose, flags, deploy_files):
    cfg = deploy_sources.load_yaml_docs(deploy_files.prometheus)[0]
    jobs = [j for j in cfg["scrape_configs"] if j["job_name"] == "fastformer"]
    assert len(jobs) == 1, "prometheus.yml: one job named fastformer (the alert rules select job=fastformer)"
    job = jobs[0]
    assert job.get("metrics_path", "/metrics") == "/metrics"
    targets = [t for sc in job["static_configs"] for t in sc["targets"]]
    # the names each service answers to on the compose network: its own and its aliases
    names = {}
    for name, svc in compose["services"].items():
        names.setdefault(name, set()).add(name)
        for net in (svc.get("networks") or {}).values() if isinstance(svc.get("networks"), dict) else []:
            for alias in (net or {}).get("aliases") or []:
                names.setdefault(alias, set()).add(name)
    scraped = {}
    for t in targets:
        host, port = t.rsplit(":", 1)
        assert host in names, f"prometheus.yml target {t}: no compose service or alias {host}"
        for svc in names[host]:
            scraped[svc] = int(port)
    for name in SERVER_SERVICES:
        eff = deploy_flags.effective(flags, _compose_env(compose["services"][name]))
        assert scraped.get(name) == deploy_flags.port_of(eff["metrics-listen"]), (name, scraped)
    # The compose Prometheus runs this file, with the rules folder beside it.
    prom = compose["services"]["prometheus"]
    assert "--config.file=/etc/prometheus/prometheus.yml" in prom["command"]
    assert "./prometheus:/etc/prometheus:ro" in prom["volumes"]
    assert 9090 in _container_ports(prom)


def test_grafana_provisioning(compose, deploy_files):
    graf = compose["services"]["grafana"]
    assert 3000 in _container_ports(graf)
    mounts = dict(str(v).split(":")[:2] for v in graf["volumes"])
    assert mounts.get("./grafana/provisioning") == "/etc/grafana/provisioning"
    # The datasource points at the compose Prometheus; the dashboard uses its uid.
    ds = [d for p in deploy_files.datasources for doc in deploy_sources.load_yaml_docs(p)
          for d in doc.get("datasources") or []]
    assert len(ds) == 1 and ds[0]["type"] == "prometheus", ds
    m = re.fullmatch(r"http://([\w-]+):(\d+)/?", ds[0]["url"])
    assert m and m.group(1) == "prometheus" and int(m.group(2)) in _container_ports(compose["services"]["prometheus"])
    dash = json.loads(deploy_files.dashboard.read_text())
    uids = set()

    def walk(o):
        if isinstance(o, dict):
            if isinstance(o.get("datasource"), dict):
                uids.add(o["datasource"].get("uid"))
            for v in o.values():
                walk(v)
        elif isinstance(o, list):
            for v in o:
                walk(v)
    walk(dash)
    assert uids == {ds[0]["uid"]}, f"dashboard datasource uids {uids}, provisioned {ds[0]['uid']}"
    # The dashboard file is mounted inside the folder the provider loads.
    providers = [p for f in deploy_files.dashboard_providers for doc in deploy_sources.load_yaml_docs(f)
                 for p in doc.get("providers") or []]
    paths = {p["options"]["path"].rstrip("/") for p in providers}
    target = mounts.get("./grafana/fastformer-dashboard.json")
    assert target and str(Path(target).parent) in paths, (target, paths)


# ----------------------------------------------------------------------------- Kubernetes


@pytest.fixture(scope="module")
def k8s(deploy_files):
    objs = {}
    for path in sorted(deploy_files.k8s.glob("*.y*ml")):
        docs = deploy_sources.load_yaml_docs(path)
        assert docs, f"{path.name} is empty"
        if path == deploy_files.adapter_rules or path.name == "kustomization.yaml":
            continue
        for d in docs:
            assert isinstance(d, dict) and d.get("apiVersion") and d.get("kind") and d.get("metadata", {}).get("name"), \
                f"{path.name}: not a Kubernetes object: {str(d)[:200]}"
            objs.setdefault(d["kind"], []).append((path.name, d))
    return objs


def _one(k8s, kind, name=None):
    got = [d for _, d in k8s.get(kind, []) if name is None or d["metadata"]["name"] == name]
    assert len(got) == 1, f"expected one {kind} {name or ''}, found {len(got)}"
    return got[0]


def _selects(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


@pytest.fixture(scope="module")
def deployment(k8s):
    return _one(k8s, "Deployment", "fastformer")


def _server_container(deployment):
    cs = deployment["spec"]["template"]["spec"]["containers"]
    assert len(cs) == 1, "one container per pod"
    return cs[0]


def test_k8s_objects_and_kustomization(k8s, deploy_files):
    for kind, api in [("Deployment", "apps/v1"), ("Service", "v1"), ("PodMonitor", "monitoring.coreos.com/v1"),
                      ("PodDisruptionBudget", "policy/v1"), ("HorizontalPodAutoscaler", "autoscaling/v2")]:
        assert kind in k8s, f"deploy/k8s has no {kind}"
        assert all(d["apiVersion"] == api for _, d in k8s[kind]), (kind, [d["apiVersion"] for _, d in k8s[kind]])
    kust = deploy_sources.load_yaml_docs(deploy_files.k8s / "kustomization.yaml")[0]
    files = {n for objs in k8s.values() for n, _ in objs}
    assert set(kust["resources"]) == files, f"kustomization resources {kust['resources']} != manifests {sorted(files)}"
    kubectl = shutil.which("kubectl")
    if kubectl:   # kustomize builds offline
        p = subprocess.run([kubectl, "kustomize", str(deploy_files.k8s)], capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr
        built = [d for d in yaml.safe_load_all(p.stdout) if d]
        assert len(built) == sum(len(v) for v in k8s.values())
        assert all(d["metadata"].get("namespace") == kust["namespace"] for d in built if d["kind"] != "Namespace")


def test_k8s_deployment_matches_flags(deployment, flags, run_server_env, deploy_files):
    pod = deployment["spec"]["template"]["spec"]
    c = _server_container(deployment)
    env = {e["name"]: e["value"] for e in c.get("env") or [] if "value" in e}
    problems = _check_env(flags, env, "deployment")
    assert not problems, "\n".join(problems)
    assert not c.get("args") and not c.get("command"), "the deployment configures the server by env only"
    # What the pod runs with: the image's ENV under the manifest's.
    pod_env = {**_image_env(deploy_files), **env}
    eff = deploy_flags.effective(flags, pod_env)
    grpc_port = deploy_flags.port_of(eff["listen"])
    metrics_port = deploy_flags.port_of(eff["metrics-listen"])
    http_port = deploy_flags.port_of(eff["http-listen"])
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"grpc": grpc_port, "http": http_port, "metrics": metrics_port}, ports
    # Readiness (and the startup probe) mean "the models are READY": native gRPC health "" on the
    # gRPC port, or GET /v2/health/ready on the HTTP port; liveness only that the process answers.
    for probe in ("readinessProbe", "livenessProbe"):
        assert probe in c, f"no {probe}"
    for probe, want in (("startupProbe", "ready"), ("readinessProbe", "ready"), ("livenessProbe", "live")):
        if probe not in c:
            continue
        assert _probe_kind(c[probe]) == want, f"{probe} should ask whether the server is {want}: {c[probe]}"
        port = _probe_port(c[probe], ports)
        assert port == (grpc_port if "grpc" in c[probe] else http_port), f"{probe} on port {port}: {c[probe]}"
    # One GPU.
    assert str(c["resources"]["limits"].get("nvidia.com/gpu")) == "1", c["resources"]
    # The model repository (or directory) volume where the server reads it, from a volume of the pod.
    flag, path = _model_source(eff, "deployment")
    assert flag == "model-repository", f"the deployment should serve a model repository, not --{flag}"
    mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts") or []}
    assert path in mounts, f"nothing mounted at {path}: {mounts}"
    volumes = {v["name"]: v for v in pod.get("volumes") or []}
    assert mounts[path] in volumes
    claim = volumes[mounts[path]].get("persistentVolumeClaim", {}).get("claimName")
    assert claim, f"the repository volume {mounts[path]} is not a PersistentVolumeClaim"
    assert eff["model-control-mode"] in ("poll", "none", "explicit"), eff["model-control-mode"]
    # Grace period: preStop sleep, then the drain of up to --shutdown-timeout-s, with room to spare.
    pre = c["lifecycle"]["preStop"]
    if "sleep" in pre:
        pre_s = float(pre["sleep"]["seconds"])
    else:
        cmd = pre["exec"]["command"]
        m = re.search(r"sleep\s+(\d+(?:\.\d+)?)", " ".join(map(str, cmd)))
        assert m, f"preStop does not sleep: {cmd}"
        pre_s = float(m.group(1))
    grace = pod["terminationGracePeriodSeconds"]
    assert grace > pre_s + _shutdown_timeout(flags, env), \
        f"terminationGracePeriodSeconds {grace} <= preStop {pre_s} s + shutdown timeout {_shutdown_timeout(flags, env)} s"
    # Upgrades never go below the current capacity.
    ru = deployment["spec"]["strategy"]["rollingUpdate"]
    assert ru["maxUnavailable"] in (0, "0%") and ru["maxSurge"] not in (0, "0%"), ru
    # The real server with the pod's environment (image + manifest), and each probe against it.
    probes = {name: c[name] for name in ("startupProbe", "readinessProbe", "livenessProbe") if name in c}
    _run_with_env(run_server_env, flags, pod_env, "k8s deployment",
                  while_up=lambda srv: [_run_probe(srv, n, p, ports) for n, p in probes.items()])


def test_k8s_services_podmonitor_pdb(k8s, deployment, flags, deploy_files):
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert _selects(deployment["spec"]["selector"]["matchLabels"], labels)
    c = _server_container(deployment)
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    env = {e["name"]: e["value"] for e in c.get("env") or [] if "value" in e}
    eff = deploy_flags.effective(flags, env)

    def resolve(target):
        return ports[target] if isinstance(target, str) else target

    plain = _one(k8s, "Service", "fastformer")
    headless = _one(k8s, "Service", "fastformer-headless")
    assert headless["spec"].get("clusterIP") == "None", "the headless Service needs clusterIP: None"
    assert plain["spec"].get("clusterIP") != "None"
    for svc in (plain, headless):
        assert _selects(svc["spec"]["selector"], labels), svc["metadata"]["name"]
        grpc = [p for p in svc["spec"]["ports"] if p["name"] == "grpc"]
        assert grpc and resolve(grpc[0].get("targetPort", grpc[0]["port"])) == deploy_flags.port_of(eff["listen"])
        assert grpc[0]["port"] == deploy_flags.port_of(flags["listen"].default)
    http = [p for p in plain["spec"]["ports"] if p["name"] == "http"]
    assert http and resolve(http[0].get("targetPort", http[0]["port"])) == deploy_flags.port_of(eff["http-listen"])
    pm = _one(k8s, "PodMonitor")
    assert _selects(pm["spec"]["selector"]["matchLabels"], labels)
    eps = pm["spec"]["podMetricsEndpoints"]
    assert len(eps) == 1 and eps[0].get("path", "/metrics") == "/metrics"
    assert resolve(eps[0]["port"]) == deploy_flags.port_of(eff["metrics-listen"]), eps
    # The job label of the scraped series is the one the alert rules and prometheus.yml use.
    job = labels.get(pm["spec"].get("jobLabel", ""), f"{pm['metadata'].get('namespace', '<namespace>')}/"
                                                      f"{pm['metadata']['name']}")
    selected = {v for path in deploy_files.rules for e in deploy_sources.rules_exprs(path)
                for sel in deploy_promql.parse(e.expr).selectors for k, op, v in sel.matchers if (k, op) == ("job", "=")}
    assert selected and selected == {job}, f"PodMonitor job label {job!r}; the alert rules select job in {selected}"
    pdb = _one(k8s, "PodDisruptionBudget")
    assert _selects(pdb["spec"]["selector"]["matchLabels"], labels)


def test_k8s_hpa_and_adapter_rule(k8s, deployment, deploy_files):
    hpa = _one(k8s, "HorizontalPodAutoscaler")
    ref = hpa["spec"]["scaleTargetRef"]
    assert (ref["kind"], ref["name"]) == ("Deployment", deployment["metadata"]["name"])
    pods = [m for m in hpa["spec"]["metrics"] if m["type"] == "Pods"]
    assert len(pods) == 1, hpa["spec"]["metrics"]
    name = pods[0]["pods"]["metric"]["name"]
    assert name == "fastformer_queue_tokens"
    assert pods[0]["pods"]["target"]["type"] == "AverageValue"
    assert float(pods[0]["pods"]["target"]["averageValue"]) > 0
    rules = deploy_sources.adapter_rules(deploy_files.adapter_rules)
    exposed = set().union(*(r.exposed_names() for r in rules))
    assert name in exposed, f"HPA metric {name} is not what the adapter rule exposes ({sorted(exposed)})"
    # The adapter maps the series to pods by the labels the PodMonitor's scrape adds.
    for r in rules:
        raw = deploy_sources.load_yaml_docs(deploy_files.adapter_rules)[0]
        overrides = raw["rules"][0]["resources"]["overrides"]
        assert overrides.get("pod", {}).get("resource") == "pod" and overrides.get("namespace", {}).get("resource") == "namespace"
        assert "<<.Series>>" in r.metrics_query and "<<.LabelMatchers>>" in r.metrics_query and "<<.GroupBy>>" in r.metrics_query
    assert hpa["spec"]["minReplicas"] >= 2, "keep two pods for the PDB and for upgrades"


def test_k8s_pod_runs_as_the_image_user(deployment, deploy_files):
    sc = deployment["spec"]["template"]["spec"].get("securityContext", {})
    assert sc.get("runAsNonRoot") is True
    text = deploy_files.dockerfile.read_text()
    m = re.search(r"useradd\b[^\n]*--uid\s+(\d+)", text)
    assert m, "the Dockerfile's useradd names no --uid: runAsUser has nothing to match"
    assert sc.get("runAsUser") == int(m.group(1)), (sc.get("runAsUser"), m.group(0))
    users = [r for w, r in _runtime_stage(text) if w == "USER"]
    assert users and users[-1].split(":")[0] == m.group(1), f"runtime USER {users} is not uid {m.group(1)}"


# ----------------------------------------------------------------------------- KServe


@pytest.fixture(scope="module")
def kserve(deploy_files):
    objs = {}
    paths = sorted(deploy_files.kserve.glob("*.y*ml"))
    assert paths, "deploy/kserve has no manifests"
    for path in paths:
        for d in deploy_sources.load_yaml_docs(path):
            assert isinstance(d, dict) and d.get("apiVersion") and d.get("kind") and d.get("metadata", {}).get("name"), \
                f"{path.name}: not a Kubernetes object: {str(d)[:200]}"
            objs.setdefault(d["kind"], []).append(d)
    runtimes, services = objs.get("ServingRuntime", []), objs.get("InferenceService", [])
    assert len(runtimes) == 1 and len(services) == 1, f"deploy/kserve: one ServingRuntime and one InferenceService, got {sorted(objs)}"
    return runtimes[0], services[0]


def test_kserve_runtime_and_inference_service(kserve, deployment):
    rt, isvc = kserve
    assert rt["apiVersion"] == "serving.kserve.io/v1alpha1", rt["apiVersion"]
    assert isvc["apiVersion"] == "serving.kserve.io/v1beta1", isvc["apiVersion"]
    formats = {f["name"] for f in rt["spec"]["supportedModelFormats"]}
    assert "fastformer" in formats, formats
    assert {"v2", "grpc-v2"} <= set(rt["spec"].get("protocolVersions") or []), rt["spec"].get("protocolVersions")
    cs = rt["spec"]["containers"]
    assert len(cs) == 1 and cs[0]["name"] == "kserve-container", [c["name"] for c in cs]
    assert cs[0]["image"] == _server_container(deployment)["image"], "the runtime runs the deployment's image"
    model = isvc["spec"]["predictor"]["model"]
    assert model["modelFormat"]["name"] == "fastformer", model["modelFormat"]
    assert model.get("runtime") == rt["metadata"]["name"], (model.get("runtime"), rt["metadata"]["name"])
    assert re.match(r"^(s3|gs|pvc|https?|hdfs|webhdfs|oci|hf)://", model.get("storageUri", "")), model.get("storageUri")
    ports = [p["containerPort"] for p in cs[0].get("ports") or []]
    if len(ports) > 1:   # Knative (Serverless) allows one container port: both need RawDeployment
        mode = (isvc["metadata"].get("annotations") or {}).get("serving.kserve.io/deploymentMode")
        assert mode in ("RawDeployment", "Standard"), f"{len(ports)} ports need RawDeployment, not {mode}"


def test_kserve_runtime_matches_flags(kserve, flags, run_server_env, deploy_files):
    """The runtime's args and env are the server's; KServe's ports (REST 8080, gRPC 8081) are the ones
    it listens on, named as Knative wants; the model repository is KServe's /mnt/models; the probes
    pass against the real server started with these args, this env and the image's."""
    rt, _ = kserve
    c = rt["spec"]["containers"][0]
    env = {e["name"]: str(e["value"]) for e in c.get("env") or [] if "value" in e}
    args = [str(a) for a in c.get("args") or []]
    assert not c.get("command"), "the image's ENTRYPOINT (fastformer-server) runs the args"
    problems = _check_env(flags, {**env, **_args_env(flags, args)}, "kserve runtime")
    assert not problems, "\n".join(problems)
    pod_env = {**_image_env(deploy_files), **env}
    eff = deploy_flags.effective(flags, {**pod_env, **_args_env(flags, args)})
    assert _model_source(eff, "kserve runtime") == ("model-repository", "/mnt/models")
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    http_port, grpc_port = deploy_flags.port_of(eff["http-listen"]), deploy_flags.port_of(eff["listen"])
    assert (http_port, grpc_port) == (8080, 8081), "KServe's custom-runtime ports: REST 8080, gRPC 8081"
    assert ports == {"http1": http_port, "h2c": grpc_port}, ports
    annotations = rt["spec"].get("annotations") or {}
    assert int(annotations.get("prometheus.kserve.io/port", 0)) == deploy_flags.port_of(eff["metrics-listen"])
    assert annotations.get("prometheus.kserve.io/path") == "/metrics"
    assert _probe_kind(c["readinessProbe"]) == "ready", c["readinessProbe"]
    assert _probe_kind(c["livenessProbe"]) == "live", c["livenessProbe"]
    probes = {name: c[name] for name in ("startupProbe", "readinessProbe", "livenessProbe") if name in c}
    for name, probe in probes.items():
        assert _probe_port(probe, ports) in ports.values(), f"{name} on a port the container does not declare"

    def while_up(srv):
        for name, probe in probes.items():
            _run_probe(srv, name, probe, ports)
        # and the gRPC port answers health "" (what a grpc-v2 client's channel first asks)
        _run_probe(srv, "gRPC port", {"grpc": {"port": grpc_port}}, ports)

    _run_with_env(run_server_env, flags, pod_env, "kserve runtime", args=args, while_up=while_up)


# ----------------------------------------------------------------------------- Dockerfile (read only here)


def _dockerfile_instructions(text):
    text = re.sub(r"\\\n", " ", text)
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            yield word.upper(), rest.strip()


def _shell_expand(word, env):
    """${VAR}, $VAR and ${VAR##*:} (what is left after the last colon) with env's values."""
    def sub(m):
        name, op = m.group(1) or m.group(3), m.group(2)
        value = str(env.get(name, ""))
        return value.rsplit(":", 1)[-1] if op == "##*:" else value
    return re.sub(r"\$\{(\w+)(##\*:)?\}|\$(\w+)", sub, word)


def _runtime_stage(text):
    """The instructions of the last stage (the image that runs)."""
    stages, cur = [], []
    for ins in _dockerfile_instructions(text):
        if ins[0] == "FROM":
            cur = []
            stages.append(cur)
        cur.append(ins)
    return stages[-1] if stages else []


def test_dockerfile_matches_flags(deploy_files, flags, client_health_flags):
    stage = _runtime_stage(deploy_files.dockerfile.read_text())
    env = {}
    for word, rest in stage:
        if word == "ENV":
            for k, v in re.findall(r"(\w+)=(\"[^\"]*\"|\S+)", rest) or [tuple(rest.split(None, 1))]:
                env[k] = v.strip('"')
    fast = {k: v for k, v in env.items() if k.startswith("FASTFORMER_")}
    # The image's ENV may also configure the health check's client (fastformer-client health).
    declared = set(deploy_flags.env_names(flags)) | set(deploy_flags.env_names(client_health_flags))
    unknown = sorted(k for k in fast if k not in declared)
    assert not unknown, f"Dockerfile ENV names no server (or health-check client) variable: {unknown}"
    server_env = {k: v for k, v in fast.items() if k in deploy_flags.env_names(flags)}
    problems = _check_env(flags, server_env, "Dockerfile")
    assert not problems, "\n".join(problems)
    runs_server = any(w in ("ENTRYPOINT", "CMD") and "fastformer-server" in r for w, r in stage)
    assert runs_server, f"the runtime stage's ENTRYPOINT/CMD does not run fastformer-server: {stage[-3:]}"
    eff = deploy_flags.effective(flags, server_env)
    ports = {int(p.split("/")[0]) for w, r in stage if w == "EXPOSE" for p in r.split()}
    assert ports == {deploy_flags.port_of(eff["listen"]), deploy_flags.port_of(eff["http-listen"]),
                     deploy_flags.port_of(eff["metrics-listen"])}, ports
    volumes = " ".join(r for w, r in stage if w == "VOLUME")
    assert eff["model-dir"] and eff["model-dir"] in volumes, (eff["model-dir"], volumes)
    hc = " ".join(r for w, r in stage if w == "HEALTHCHECK")
    assert "fastformer-client" in hc and "health" in hc, f"HEALTHCHECK: {hc!r}"
    m = re.search(r"--target[ =]+(\S+)", hc)
    if m:   # a shell-form CMD may take the port from the image's own variables
        target = _shell_expand(m.group(1).strip("\"',[]"), {**env, **server_env})
        assert deploy_flags.port_of(target) == deploy_flags.port_of(eff["listen"]), (hc, target)
    users = [r for w, r in stage if w == "USER"]
    assert users and users[-1] not in ("root", "0"), f"runtime USER: {users}"


def test_health_check_client_reads_no_server_variable(flags, client_health_flags):
    """The image's HEALTHCHECK runs `fastformer-client health` with the server's environment: a
    variable both programs read, with different meanings, misconfigures the health check (the
    server's certificate becomes the client's)."""
    shared = sorted(set(deploy_flags.env_names(flags)) & set(deploy_flags.env_names(client_health_flags)))
    assert not shared, f"variables read by both fastformer-server and fastformer-client health: {shared}"


def test_k8s_jobs_statefulset_gives_each_pod_its_own_volume(flags, deploy_files):
    """deploy/k8s/jobs (issue 50): jobs belong to one server's directory, so the servers that keep
    them are a StatefulSet whose volumeClaimTemplates give each pod a ReadWriteOnce volume,
    mounted where FASTFORMER_JOBS_DIR points; its env is the server's; a headless Service gives
    each pod its own name; the kustomization lists the files and builds."""
    d = deploy_files.k8s / "jobs"
    sts = deploy_sources.load_yaml_docs(d / "statefulset.yaml")[0]
    svc = deploy_sources.load_yaml_docs(d / "service.yaml")[0]
    assert (sts["apiVersion"], sts["kind"]) == ("apps/v1", "StatefulSet")
    pod = sts["spec"]["template"]
    labels = pod["metadata"]["labels"]
    assert _selects(sts["spec"]["selector"]["matchLabels"], labels)
    assert labels.get("app.kubernetes.io/component") != "server", "the jobs pods must not join the Deployment's Services"
    [c] = pod["spec"]["containers"]
    env = {e["name"]: e["value"] for e in c.get("env") or [] if "value" in e}
    problems = _check_env(flags, env, "jobs statefulset")
    assert not problems, "\n".join(problems)
    claims = {t["metadata"]["name"]: t["spec"] for t in sts["spec"]["volumeClaimTemplates"]}
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    jobs_dir = env["FASTFORMER_JOBS_DIR"]
    assert mounts.get(jobs_dir) in claims, f"{jobs_dir} is not on a volume of volumeClaimTemplates: {mounts}"
    assert claims[mounts[jobs_dir]]["accessModes"] == ["ReadWriteOnce"]
    assert mounts.get("/models") and pod["spec"]["securityContext"].get("fsGroup"), "the volume must be writable"
    assert svc["spec"].get("clusterIP") == "None" and sts["spec"]["serviceName"] == svc["metadata"]["name"]
    assert _selects(svc["spec"]["selector"], labels)
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports["http"] == deploy_flags.port_of(deploy_flags.effective(flags, env)["http-listen"])
    kust = deploy_sources.load_yaml_docs(d / "kustomization.yaml")[0]
    assert sorted(kust["resources"]) == sorted(p.name for p in d.glob("*.yaml") if p.name != "kustomization.yaml")
    kubectl = shutil.which("kubectl")
    if kubectl:   # kustomize builds offline
        p = subprocess.run([kubectl, "kustomize", str(d)], capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr
