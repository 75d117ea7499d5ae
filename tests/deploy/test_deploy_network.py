"""The NetworkPolicies in k8s/: each edge of the pipeline is allowed on both ends, and nothing else is.

The edges are derived from the manifests, not listed here: every ``FLYWHEEL_<SERVICE>_*_ENDPOINT`` in the ConfigMap
that names a Service, Prometheus's scrape targets, Grafana's datasource, and the HTTP ports opened to everyone as
before (the gateway's and Grafana's). A small evaluator of the NetworkPolicy rules (podSelector, namespaceSelector,
ipBlock, ports by number or name, endPort, policyTypes) then checks every (source, destination, port, protocol)
among the pods of k8s/, a pod of another namespace and an address outside the cluster.
"""

from __future__ import annotations

import functools
import ipaddress
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

import pytest
import yaml
from deploy_helpers import NAMESPACE, WORKLOAD_KINDS, k8s_docs, k8s_objects, split_var


@dataclass(frozen=True)
class Peer:
    """One end of a connection: a pod (its namespace, labels and named container ports) or an outside address."""

    name: str
    namespace: str | None  # None: outside the cluster
    labels: dict[str, str] = field(default_factory=dict, hash=False)
    ports: dict[str, int] = field(default_factory=dict, hash=False)  # container port name -> number
    ip: str = "10.0.0.1"


def flywheel_pods() -> dict[str, Peer]:
    pods = {}
    for _, doc in k8s_docs():
        if doc["kind"] in WORKLOAD_KINDS:
            template = doc["spec"]["template"]
            ports = {p["name"]: p["containerPort"] for c in template["spec"]["containers"] for p in c.get("ports", [])
                     if "name" in p}
            pods[doc["metadata"]["name"]] = Peer(doc["metadata"]["name"], doc["metadata"]["namespace"],
                                                 template["metadata"]["labels"], ports)
    return pods


PODS = flywheel_pods()
OBJECTS = {kind: k8s_objects(kind) for kind in ("NetworkPolicy", "Service", "ConfigMap")}  # parsed once
KUBE_DNS = Peer("kube-dns", "kube-system", {"k8s-app": "kube-dns"}, {"dns": 53, "dns-tcp": 53})
ELSEWHERE = Peer("a pod in another namespace", "default", {"app": "ingress-nginx"})
OUTSIDE = Peer("outside the cluster", None, ip="203.0.113.7")
EVERYONE = (ELSEWHERE, OUTSIDE)
# The HTTP ports people reach from outside the pipeline, as before the policies (an Ingress controller, a browser
# through one): a decision, so it is listed rather than derived.
PUBLIC = {("gateway", "http"), ("grafana", "http")}


def namespace_labels(namespace: str) -> dict[str, str]:
    return {"kubernetes.io/metadata.name": namespace}


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    if not all(labels.get(k) == v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values", [])
        ok = {"In": key in labels and labels[key] in values, "NotIn": labels.get(key) not in values,
              "Exists": key in labels, "DoesNotExist": key not in labels}[op]
        if not ok:
            return False
    return True


def peer_matches(rule_peer: dict[str, Any], policy_namespace: str, peer: Peer) -> bool:
    if "ipBlock" in rule_peer:  # for addresses outside the cluster (pod addresses are not fixed)
        block = rule_peer["ipBlock"]
        address = ipaddress.ip_address(peer.ip)
        return peer.namespace is None and address in ipaddress.ip_network(block["cidr"]) and not any(
            address in ipaddress.ip_network(cidr) for cidr in block.get("except", []))
    if peer.namespace is None:
        return False
    if "namespaceSelector" in rule_peer:
        in_namespace = selects(rule_peer["namespaceSelector"], namespace_labels(peer.namespace))
    else:
        in_namespace = peer.namespace == policy_namespace
    return in_namespace and selects(rule_peer.get("podSelector") or {}, peer.labels)


def port_matches(rule_ports: list[dict[str, Any]] | None, port: int, protocol: str, destination: Peer) -> bool:
    if not rule_ports:
        return True  # no ports: every port
    for rule_port in rule_ports:
        if rule_port.get("protocol", "TCP") != protocol:
            continue
        if "port" not in rule_port:
            return True
        first = rule_port["port"]
        if isinstance(first, str):  # a named port: the destination container's port of that name
            first = destination.ports.get(first)
            if first is None:
                continue
        if first <= port <= rule_port.get("endPort", first):
            return True
    return False


def policy_types(spec: dict[str, Any]) -> list[str]:
    return spec.get("policyTypes") or ["Ingress", *(["Egress"] if "egress" in spec else [])]


def side_allows(direction: str, pod: Peer, other: Peer, port: int, protocol: str, destination: Peer) -> bool:
    """Whether the policies selecting ``pod`` let this connection through on its side (no policy: it is open)."""
    policies = [doc for doc in OBJECTS["NetworkPolicy"].values()
                if doc["metadata"]["namespace"] == pod.namespace
                and selects(doc["spec"]["podSelector"], pod.labels) and direction in policy_types(doc["spec"])]
    if not policies:
        return True
    rules_key, peers_key = ("ingress", "from") if direction == "Ingress" else ("egress", "to")
    for doc in policies:
        for rule in doc["spec"].get(rules_key) or []:
            peers = rule.get(peers_key)
            if (not peers or any(peer_matches(p, doc["metadata"]["namespace"], other) for p in peers)) and (
                    port_matches(rule.get("ports"), port, protocol, destination)):
                return True
    return False


def allowed(source: Peer, destination: Peer, port: int, protocol: str = "TCP") -> bool:
    return (side_allows("Egress", source, destination, port, protocol, destination)
            and side_allows("Ingress", destination, source, port, protocol, destination))


# ---- the edges, from the manifests -----------------------------------------------------------------------------

def service_ports() -> dict[tuple[str, int], tuple[str, int]]:
    """(Service, port) -> (the workload it selects, the container port it reaches)."""
    ports = {}
    for name, service in OBJECTS["Service"].items():
        (pod,) = [p for p in PODS.values() if selects({"matchLabels": service["spec"]["selector"]}, p.labels)]
        for port in service["spec"]["ports"]:
            target = port.get("targetPort", port["port"])
            ports[(name, port["port"])] = (pod.name, pod.ports[target] if isinstance(target, str) else target)
    return ports


def service_of(host: str) -> str | None:
    """The Service a host name means inside the namespace: ``replay``, ``gateway.flywheel.svc``, ..."""
    name, _, rest = host.partition(".")
    return name if name in OBJECTS["Service"] and rest in ("", NAMESPACE, f"{NAMESPACE}.svc",
                                                 f"{NAMESPACE}.svc.cluster.local") else None


@functools.cache
def expected_edges() -> frozenset[tuple[str, str, int]]:
    """(source, destination workload, container port): what the configuration connects, and the public ports."""
    reaches = service_ports()
    wanted: list[tuple[str, str]] = []  # (source, "host:port")
    for key, value in OBJECTS["ConfigMap"]["flywheel-config"]["data"].items():
        service, setting = split_var(key)
        if service and setting.endswith("endpoint") and value.startswith("tcp://"):
            wanted.append((service, value.removeprefix("tcp://")))
    prometheus = yaml.safe_load(OBJECTS["ConfigMap"]["prometheus-config"]["data"]["prometheus.yml"])
    wanted += [("prometheus", target) for job in prometheus["scrape_configs"]
               for group in job.get("static_configs", []) for target in group["targets"]]
    provisioning = OBJECTS["ConfigMap"]["grafana-provisioning"]["data"]
    wanted += [("grafana", urlparse(source["url"]).netloc) for key, text in provisioning.items()
               if key.startswith("datasources-") for source in yaml.safe_load(text)["datasources"]]
    edges = set()
    for source, address in wanted:
        host, _, port = address.rpartition(":")
        service = service_of(host)
        if service is None:  # a bind (tcp://*:5558) or the pod itself (Prometheus's localhost:9090)
            assert host in ("*", "localhost", "127.0.0.1", "0.0.0.0"), f"{source} connects to unknown {address}"
            continue
        assert (service, int(port)) in reaches, f"{source} connects to {address}, which no Service port offers"
        edges.add((source, *reaches[(service, int(port))]))
    for workload, port_name in PUBLIC:
        edges |= {(peer.name, workload, PODS[workload].ports[port_name]) for peer in EVERYONE}
    return frozenset(edges)


def test_the_edges_cover_every_service_port() -> None:
    """Each port a Service offers has a client in the configuration (or is public): no edge is left out."""
    edges = expected_edges()
    offered = set(service_ports().values())
    used = {(destination, port) for _, destination, port in edges}
    assert offered == used, f"Service ports nobody connects to: {offered - used}; edges to no Service: {used - offered}"
    pipeline = {(s, d, p) for s, d, p in edges if s in PODS}
    assert {("actor", "replay", 5555), ("learner", "replay", 5556), ("actor", "learner", 5557),
            ("actor", "gateway", 5560), ("prometheus", "gateway", 8080), ("grafana", "prometheus", 9090)} <= pipeline
    for service in ("replay", "learner", "actor"):
        assert {(service, "gateway", 5558), (service, "gateway", 5559)} <= pipeline, service


def test_policies_allow_each_edge_and_nothing_else() -> None:
    edges = expected_edges()
    sources = [*PODS.values(), *EVERYONE]
    probe_ports = {53, 80, 443, 12345} | {port for pod in PODS.values() for port in pod.ports.values()} | {
        port for _, port in service_ports()}
    wrong = []
    for source in sources:
        for destination in PODS.values():
            for port in sorted(probe_ports):
                for protocol in ("TCP", "UDP"):
                    want = protocol == "TCP" and (source.name, destination.name, port) in edges
                    if allowed(source, destination, port, protocol) != want:
                        wrong.append(f"{source.name} -> {destination.name}:{port}/{protocol} "
                                     f"{'denied' if want else 'allowed'}")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("direction", ["Ingress", "Egress"])
def test_each_side_alone_allows_only_the_edges(direction: str) -> None:
    """Defence in depth: the server's ingress rules alone, and the client's egress rules alone, are as tight (the
    public ports take anyone on the ingress side; the clients' egress rules then pick who gets there)."""
    edges = expected_edges()
    public = {(workload, PODS[workload].ports[name]) for workload, name in PUBLIC}
    ports = sorted({port for pod in PODS.values() for port in pod.ports.values()} | {53, 443, 12345})
    wrong = []
    for source in [*PODS.values(), *EVERYONE] if direction == "Ingress" else PODS.values():
        for destination in PODS.values() if direction == "Ingress" else [*PODS.values(), *EVERYONE]:
            pod, other = (destination, source) if direction == "Ingress" else (source, destination)
            for port in ports:
                for protocol in ("TCP", "UDP"):
                    want = protocol == "TCP" and ((source.name, destination.name, port) in edges or (
                        direction == "Ingress" and (destination.name, port) in public))
                    if side_allows(direction, pod, other, port, protocol, destination) != want:
                        wrong.append(f"{direction} of {pod.name}: {source.name} -> {destination.name}:{port}/"
                                     f"{protocol} {'denied' if want else 'allowed'}")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("pod", sorted(PODS))
def test_every_pod_resolves_names_and_reaches_nothing_else_outside(pod: str) -> None:
    source = PODS[pod]
    assert allowed(source, KUBE_DNS, 53, "UDP") and allowed(source, KUBE_DNS, 53, "TCP"), "DNS"
    assert not allowed(source, KUBE_DNS, 443) and not allowed(source, KUBE_DNS, 5353, "UDP")
    other_dns = Peer("a kube-dns look-alike elsewhere", "default", {"k8s-app": "kube-dns"})
    assert not allowed(source, other_dns, 53, "UDP"), "only the cluster DNS in kube-system"
    for port in (53, 80, 443, 5555):
        assert not allowed(source, OUTSIDE, port) and not allowed(source, ELSEWHERE, port), port


def test_default_deny_covers_pods_that_no_policy_names() -> None:
    stranger = Peer("a new pod", NAMESPACE, {"app.kubernetes.io/name": "debug"}, {"http": 8000})
    deny = OBJECTS["NetworkPolicy"]["default-deny"]["spec"]
    assert deny["podSelector"] == {} and set(policy_types(deny)) == {"Ingress", "Egress"}
    for pod in PODS.values():
        for port in pod.ports.values():
            if (stranger.name, pod.name, port) not in expected_edges():
                assert not allowed(stranger, pod, port), f"a new pod -> {pod.name}:{port}"
        assert not allowed(pod, stranger, 8000), f"{pod.name} -> a new pod"
    assert allowed(stranger, KUBE_DNS, 53, "UDP"), "it still resolves names"


def test_every_selector_in_the_policies_selects_a_pod() -> None:
    """A misspelt label would select nothing and go unnoticed by the edge checks when its rule is redundant."""
    for name, doc in OBJECTS["NetworkPolicy"].items():
        spec = doc["spec"]
        assert spec["podSelector"] == {} or any(selects(spec["podSelector"], p.labels) for p in PODS.values()), name
        for rule in [*spec.get("ingress", []), *spec.get("egress", [])]:
            for peer in [*rule.get("from", []), *rule.get("to", [])]:
                if "namespaceSelector" not in peer and "ipBlock" not in peer:
                    assert any(selects(peer["podSelector"], p.labels) for p in PODS.values()), f"{name}: {peer}"


def test_the_evaluator_reads_rules_as_kubernetes_does() -> None:
    """The evaluator itself on hand-made cases: an empty peer list is everyone, named ports, endPort, ipBlock."""
    web = Peer("web", "elsewhere", {"app": "web"}, {"http": 8080})
    client = Peer("client", "elsewhere", {"app": "client"})

    def check(spec: dict[str, Any], source: Peer, port: int) -> bool:
        policy = {"metadata": {"namespace": "elsewhere"}, "spec": {"podSelector": {"matchLabels": {"app": "web"}},
                                                                   "policyTypes": ["Ingress"], **spec}}
        rules = policy["spec"]["ingress"]
        return any((not r.get("from") or any(peer_matches(p, "elsewhere", source) for p in r["from"]))
                   and port_matches(r.get("ports"), port, "TCP", web) for r in rules)

    assert check({"ingress": [{}]}, OUTSIDE, 1)
    assert check({"ingress": [{"ports": [{"port": "http"}]}]}, client, 8080)
    assert not check({"ingress": [{"ports": [{"port": "http"}]}]}, client, 8081)
    assert check({"ingress": [{"ports": [{"port": 8000, "endPort": 8100}]}]}, client, 8080)
    assert not check({"ingress": [{"from": [{"podSelector": {}}]}]}, OUTSIDE, 8080)
    assert check({"ingress": [{"from": [{"ipBlock": {"cidr": "203.0.113.0/24"}}]}]}, OUTSIDE, 8080)
    assert not check({"ingress": [{"from": [{"ipBlock": {"cidr": "203.0.113.0/24", "except": ["203.0.113.0/29"]}}]}]},
                     OUTSIDE, 8080)
    assert not check({"ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "client"}}}]}]}, web, 8080)
    assert check({"ingress": [{"from": [{"namespaceSelector": {}}]}]}, KUBE_DNS, 8080)
    assert not allowed(PODS["actor"], PODS["replay"], 5555, "UDP") and allowed(PODS["actor"], PODS["replay"], 5555)
