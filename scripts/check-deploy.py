#!/usr/bin/env python3
"""Static checks of deploy/: the compose file and the Kubernetes manifests parse and hold what
docs/deployment.md says (two replicas, probes on /healthz and /readyz of the metrics port,
secrets for TLS and tokens), every `serve` flag they pass exists in `cipherlora serve --help`,
and the Dockerfile ships the release binary the README builds.

Usage: check-deploy.py CIPHERLORA_BINARY   (needs PyYAML)
"""

import re
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"


def fail(msg: str) -> None:
    print(f"check-deploy: {msg}", file=sys.stderr)
    sys.exit(1)


def serve_flags(binary: str) -> set[str]:
    out = subprocess.run([binary, "serve", "--help"], capture_output=True, text=True, check=True)
    return set(re.findall(r"--[a-z][a-z0-9-]*", out.stdout))


def check_args(where: str, args: list[str], flags: set[str]) -> None:
    if not args or args[0] != "serve":
        fail(f"{where}: runs {args[:1]}, not `serve`")
    for a in args[1:]:
        flag = a.split("=", 1)[0]
        if flag.startswith("--") and flag not in flags:
            fail(f"{where}: `{flag}` is not a flag of `cipherlora serve`")
    for needed in ("--tls-cert", "--tls-key", "--token-file", "--metrics-listen"):
        if not any(a.startswith(needed) for a in args):
            fail(f"{where}: serves without {needed}")


def main() -> None:
    flags = serve_flags(sys.argv[1])

    docker = (DEPLOY / "Dockerfile").read_text()
    if "cargo build --release --locked -p cipherlora" not in docker:
        fail("Dockerfile: does not build the README's release binary")
    if "COPY --from=build /src/target/release/cipherlora " not in docker:
        fail("Dockerfile: does not ship target/release/cipherlora")
    readme = (ROOT / "README.md").read_text()
    if "cargo build --release -p cipherlora" not in readme and "-p cipherlora" not in readme:
        fail("README no longer builds `-p cipherlora`")

    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services = compose["services"]
    replicas = [s for s in services if s.startswith("adapter-")]
    if len(replicas) < 2:
        fail("compose.yaml: fewer than two replicas")
    for name in replicas:
        check_args(f"compose {name}", services[name]["command"], flags)
    if "balancer" not in services or "prometheus" not in services:
        fail("compose.yaml: no balancer or no prometheus")
    prom = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    targets = prom["scrape_configs"][0]["static_configs"][0]["targets"]
    if sorted(t.split(":")[0] for t in targets) != sorted(replicas):
        fail(f"prometheus.yml scrapes {targets}, not the replicas {replicas}")

    docs = list(yaml.safe_load_all((DEPLOY / "k8s" / "adapter-server.yaml").read_text()))
    kinds = {d["kind"]: d for d in docs}
    if set(kinds) != {"Deployment", "Service"}:
        fail(f"k8s: kinds {sorted(kinds)}")
    dep = kinds["Deployment"]
    if dep["apiVersion"] != "apps/v1" or dep["spec"]["replicas"] < 2:
        fail("k8s: the Deployment is not apps/v1 with two replicas or more")
    labels = dep["spec"]["selector"]["matchLabels"]
    if dep["spec"]["template"]["metadata"]["labels"] != labels:
        fail("k8s: the pod template's labels do not match the selector")
    if kinds["Service"]["spec"]["selector"] != labels:
        fail("k8s: the Service does not select the Deployment's pods")
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    check_args("k8s container", c["args"], flags)
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        got = c[probe]["httpGet"]
        if got["path"] != path or got["port"] != "metrics":
            fail(f"k8s: {probe} is {got}, not {path} on the metrics port")
    metrics_port = next(a.split(":")[-1] for a in c["args"] if a.startswith("--metrics-listen"))
    if str(ports["metrics"]) != metrics_port:
        fail("k8s: the metrics port is not where the server listens")
    secrets = {v["secret"]["secretName"] for v in dep["spec"]["template"]["spec"]["volumes"] if "secret" in v}
    if secrets != {"cipherlora-tls", "cipherlora-tokens"}:
        fail(f"k8s: secrets {sorted(secrets)}")
    metrics_rs = (ROOT / "crates/service/src/metrics.rs").read_text()
    for path in ("/readyz", "/healthz", "/metrics"):
        if f'b"GET {path} "' not in metrics_rs:
            fail(f"the server does not answer {path}")
    print("check-deploy: compose, Kubernetes manifests and Dockerfile agree with the server")


if __name__ == "__main__":
    main()
