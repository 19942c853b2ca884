"""Offline checks of deploy/kubernetes (run by scripts/check-deploy.sh).

1. Every manifest, and what each kustomization renders, against the
   Kubernetes schemas that kubernetes-validate ships (strict: an unknown
   field is an error), for the oldest Kubernetes the manifests need and the
   newest the package knows.
2. The TFJob against the Training Operator's CRD schema, vendored in
   deploy/kubernetes/vendor/ (unknown fields refused, as the API server's
   strict field validation does), the checks of the operator's admission
   webhook, and each replica's pod template against the Kubernetes schemas.
3. The StatefulSets agree with dtf.toml: replicas against cluster.ps and
   cluster.worker, each address the pod's own stable name, the container
   ports the ps's and metrics.listen's; every file dtf.toml names (token,
   TLS, checkpoints, data) is on a volume of every pod that reads it.
4. The NetworkPolicy: every dtf pod isolated, the ps's port open to the
   ps, chief and worker pods and to no other pod, its ports dtf.toml's,
   /metrics open to a Prometheus of another namespace.
5. The oldest Kubernetes the manifests claim (VERSIONS[0]): every field in
   its schema, and each field its schema calls alpha, beta or behind a
   feature gate listed in GATES with the release that turns it on.
6. scripts/make-tls-cert.sh's certificate, with openssl: a name for every
   ps as dtf.toml dials it (and qualified), serverAuth and clientAuth, its
   key, its CA.

The kustomization is rendered as it comes and with each patch a user turns
on by uncommenting it (TLS, their own data), as docs/deploy.md says to.

The kustomizations are rendered here (kustomize's features that they use:
resources, namespace, images, replicas, generators, JSON patches with a
target); a key this renderer does not know is an error, so a kustomization
never passes unchecked. Where `kubectl` is installed, its `kustomize` output
is compared with this renderer's.

--self-test first breaks copies of the manifests in ways each check must
catch, and fails if one is not caught.
"""

import copy
import functools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib

import jsonpatch
import jsonschema
import kubernetes_validate
import yaml

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "deploy", "kubernetes")
ROOT = os.path.normpath(ROOT)
CRD = os.path.join(ROOT, "vendor", "kubeflow.org_tfjobs.yaml")
# The oldest Kubernetes the manifests work on (docs/deploy.md, README), and
# the newest schemas the package ships.
VERSIONS = ["1.27.0", "1.37.0"]
# Fields that the oldest version's schema calls alpha, beta or behind a
# feature gate, used here: (the gate, the release from which it is on by
# default). A field so described that is not listed is an error, so a new
# gated field cannot raise the minimum version unseen.
GATES = {
    # worker.yaml: worker ordinals start at 1 (StatefulSetStartOrdinal:
    # alpha 1.26, beta and on 1.27, GA 1.31). Off, the API server drops the
    # field and worker 1 would be dtf-worker-0.
    "io.k8s.api.apps.v1.StatefulSetSpec.ordinals": ("StatefulSetStartOrdinal", "1.27"),
    # ps.yaml's PodDisruptionBudget (beta and on 1.27, GA 1.31).
    "io.k8s.api.policy.v1.PodDisruptionBudgetSpec.unhealthyPodEvictionPolicy":
        ("PDBUnhealthyPodEvictionPolicy", "1.27"),
    # networkpolicy.yaml (beta 1.8, GA 1.12; the description still says 1.8).
    "io.k8s.api.networking.v1.NetworkPolicySpec.policyTypes": ("none", "1.8"),
}
GATE_WORDS = re.compile(r"\b(alpha|beta)\b|feature gate", re.I)
# Files the image holds (scripts/image.sh): no volume needed.
IMAGE_PATHS = ("/usr/share/datasets/",)
KUSTOMIZE_KEYS = {
    "apiVersion", "kind", "namespace", "resources", "images", "replicas",
    "configMapGenerator", "secretGenerator", "generatorOptions", "patches",
}


class Failure(Exception):
    pass


# libyaml's loader where PyYAML has it: the vendored CRD takes seconds in
# pure Python, and every self-test case loads it.
YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
# kubernetes_validate reads a kind's schema and the 2 MB of definitions from
# disk on every call; they do not change during a run (nothing mutates them).
kubernetes_validate.utils.schema_contents = functools.cache(kubernetes_validate.utils.schema_contents)


def load_docs(path):
    with open(path) as f:
        return [d for d in yaml.load_all(f, Loader=YAML_LOADER) if d is not None]


def validate_k8s(doc, where):
    """Strict schema validation of one object for every version in VERSIONS."""
    errors = []
    for version in VERSIONS:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            path = "/".join(str(p) for p in e.path)
            errors.append(f"{where}: Kubernetes {version}: {path}: {e.message}")
        except kubernetes_validate.SchemaNotFoundError as e:
            errors.append(f"{where}: Kubernetes {version}: no schema for {e}")
    return errors + check_gates(doc, where)


def schema_defs(version):
    """The definitions of `version`'s strict schemas, and the name of each
    kind's definition by (group, version, kind)."""
    if version not in _DEFS:
        defs = kubernetes_validate.utils.schema_contents(
            f"kubernetes-json-schema/v{version}-local-strict/_definitions.json", version)["$defs"]
        gvk = {}
        for name, d in defs.items():
            for g in d.get("x-kubernetes-group-version-kind", []):
                gvk[(g["group"], g["version"], g["kind"])] = name
        _DEFS[version] = (defs, gvk)
    return _DEFS[version]


_DEFS = {}


def check_gates(doc, where):
    """Each field of `doc` that the oldest version's schema describes as
    alpha, beta or behind a feature gate must be in GATES, on by default in
    that version."""
    defs, gvk = schema_defs(VERSIONS[0])
    group, _, version = doc.get("apiVersion", "").rpartition("/")
    top = gvk.get((group, version, doc.get("kind")))
    if top is None:
        return []
    errors = []
    oldest = tuple(int(x) for x in VERSIONS[0].split(".")[:2])

    def ref(schema):
        r = (schema or {}).get("$ref", "")
        return r.rpartition("/")[2] or None

    def walk(name, value, path):
        d = defs.get(name, {})
        if isinstance(value, list):
            for i, v in enumerate(value):
                walk(name, v, f"{path}/{i}")
            return
        if not isinstance(value, dict):
            return
        for key, v in value.items():
            prop = d.get("properties", {}).get(key)
            if prop is None:
                extra = d.get("additionalProperties")
                if isinstance(extra, dict) and ref(extra):
                    walk(ref(extra), v, f"{path}/{key}")
                continue
            field = f"{name}.{key}"
            if GATE_WORDS.search(prop.get("description", "")):
                gate = GATES.get(field)
                if gate is None:
                    errors.append(f"{where}: {path}/{key}: Kubernetes {VERSIONS[0]}'s schema calls it alpha, "
                                  f"beta or gated ({prop['description'][-160:]!r}): list it in GATES with "
                                  "the release that turns it on, and raise the minimum version if need be")
                elif tuple(int(x) for x in gate[1].split(".")) > oldest:
                    errors.append(f"{where}: {path}/{key}: feature gate {gate[0]} is on by default only "
                                  f"from Kubernetes {gate[1]}, after the oldest claimed, {VERSIONS[0]}")
            inner = ref(prop) or ref(prop.get("items")) or ref(prop.get("additionalProperties"))
            if inner and isinstance(prop.get("additionalProperties"), dict) and isinstance(v, dict):
                for k2, v2 in v.items():
                    walk(inner, v2, f"{path}/{key}/{k2}")
            elif inner:
                walk(inner, v, f"{path}/{key}")

    walk(top, doc, "")
    return errors


# --- kustomize, the features these kustomizations use ---------------------


def render(directory, secrets=None):
    """Renders the kustomization in `directory`; `secrets` maps a generator
    file name to stand-in content (the real ones are not in git)."""
    secrets = secrets or {}
    with open(os.path.join(directory, "kustomization.yaml")) as f:
        k = yaml.safe_load(f)
    unknown = set(k) - KUSTOMIZE_KEYS
    if unknown:
        raise Failure(f"{directory}/kustomization.yaml: keys this check cannot render: {sorted(unknown)}")
    objs = []
    for r in k.get("resources", []):
        objs += load_docs(os.path.join(directory, r))
    hashless = k.get("generatorOptions", {}).get("disableNameSuffixHash", False)
    renames = {}
    for kind, key in (("ConfigMap", "configMapGenerator"), ("Secret", "secretGenerator")):
        for gen in k.get(key, []):
            data = {}
            for spec in gen.get("files", []):
                name, _, path = spec.partition("=") if "=" in spec else (os.path.basename(spec), "", spec)
                full = os.path.join(directory, path)
                if path in secrets:
                    content = secrets[path]
                elif os.path.exists(full):
                    with open(full) as f:
                        content = f.read()
                else:
                    raise Failure(f"{directory}: generator {gen['name']} names {path}, which does not exist")
                data[name] = content
            unknown = set(gen) - {"name", "files", "options"}
            if unknown:
                raise Failure(f"{directory}: generator {gen['name']}: keys this check cannot render: {sorted(unknown)}")
            obj = {"apiVersion": "v1", "kind": kind, "metadata": {"name": gen["name"]}}
            obj["stringData" if kind == "Secret" else "data"] = data
            if kind == "Secret":
                obj["type"] = "Opaque"
            if not gen.get("options", {}).get("disableNameSuffixHash", hashless):
                renames[(kind, gen["name"])] = gen["name"] + "-HASH"
            objs.append(obj)
    for obj in objs:
        if "namespace" in k and obj["kind"] not in ("Namespace",):
            obj["metadata"]["namespace"] = k["namespace"]
    for rep in k.get("replicas", []):
        hits = [o for o in objs if o["kind"] in ("StatefulSet", "Deployment") and o["metadata"]["name"] == rep["name"]]
        if not hits:
            raise Failure(f"{directory}: replicas names {rep['name']}, which no resource is")
        for o in hits:
            o["spec"]["replicas"] = rep["count"]
    for patch in k.get("patches", []):
        target = patch.get("target") or {}
        if "path" in patch:
            with open(os.path.join(directory, patch["path"])) as f:
                ops = yaml.safe_load(f)
        else:
            ops = yaml.safe_load(patch["patch"])
        if not isinstance(ops, list):
            raise Failure(f"{directory}: only JSON patches (a list of operations) are rendered here")
        name = re.compile(f"^(?:{target.get('name', '.*')})$")
        hits = [o for o in objs if o["kind"] == target.get("kind", o["kind"]) and name.match(o["metadata"]["name"])]
        if not hits:
            raise Failure(f"{directory}: a patch's target {target} matches no resource")
        for i, o in enumerate(objs):
            if o in hits:
                try:
                    objs[i] = jsonpatch.apply_patch(o, ops)
                except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as e:
                    raise Failure(f"{directory}: patch {target} on {o['metadata']['name']}: {e}")
    for img in k.get("images", []):
        used = False
        for o in objs:
            for c in pod_containers(o):
                if c.get("image", "").split(":")[0] == img["name"]:
                    c["image"] = f"{img.get('newName', img['name'])}:{img['newTag']}"
                    used = True
        if not used:
            raise Failure(f"{directory}: images names {img['name']}, which no container uses")
    for o in objs:
        for spec in pod_specs(o):
            for v in spec.get("volumes", []):
                if "configMap" in v:
                    v["configMap"]["name"] = renames.get(("ConfigMap", v["configMap"]["name"]), v["configMap"]["name"])
                if "secret" in v:
                    v["secret"]["secretName"] = renames.get(("Secret", v["secret"]["secretName"]), v["secret"]["secretName"])
        kind_name = (o["kind"], o["metadata"]["name"])
        if kind_name in renames:
            o["metadata"]["name"] = renames[kind_name]
    return objs


def pod_specs(obj):
    if obj["kind"] in ("StatefulSet", "Deployment"):
        yield obj["spec"]["template"]["spec"]
    elif obj["kind"] == "TFJob":
        for r in obj["spec"]["tfReplicaSpecs"].values():
            yield r["template"]["spec"]


def pod_containers(obj):
    for spec in pod_specs(obj):
        yield from spec.get("containers", [])


def normalized(objs):
    """For comparison with kubectl kustomize: generated names without their
    hash, generated data as plain text, sorted."""
    out = []
    for o in objs:
        o = copy.deepcopy(o)
        if o["kind"] == "Secret" and "data" in o:
            import base64
            o["stringData"] = {k: base64.b64decode(v).decode() for k, v in o.pop("data").items()}
        text = json.dumps(o, sort_keys=True)
        text = re.sub(r'"(dtf-[a-z-]+?)-(?:HASH|[a-z0-9]{10})"', r'"\1-HASH"', text)
        out.append(text)
    return sorted(out)


# --- the checks ------------------------------------------------------------


@functools.cache
def crd_schema():
    crd = load_docs(CRD)[0]
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return strict_openapi(version["schema"]["openAPIV3Schema"])


def strict_openapi(schema):
    """A CRD's structural schema as JSON Schema that refuses unknown fields
    (the API server prunes them, or refuses them with strict validation)."""
    s = {k: v for k, v in schema.items() if not k.startswith("x-kubernetes")}
    if schema.get("x-kubernetes-int-or-string"):
        s.pop("type", None)
        s["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if "properties" in s:
        s["properties"] = {k: strict_openapi(v) for k, v in s["properties"].items()}
        if "additionalProperties" not in s and not schema.get("x-kubernetes-preserve-unknown-fields"):
            s["additionalProperties"] = False
    if isinstance(s.get("additionalProperties"), dict):
        s["additionalProperties"] = strict_openapi(s["additionalProperties"])
    if "items" in s:
        s["items"] = strict_openapi(s["items"])
    return s


def check_tfjob(job, where, schema):
    errors = []
    validator = jsonschema.Draft7Validator(schema)
    for e in validator.iter_errors(job):
        errors.append(f"{where}: TFJob CRD schema: {'/'.join(str(p) for p in e.absolute_path)}: {e.message}")
    # The operator's admission webhook (pkg/webhooks/tensorflow/tfjob_webhook.go).
    name = job.get("metadata", {}).get("name", "")
    if not re.fullmatch(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?", name):
        errors.append(f"{where}: metadata.name {name!r} is not a DNS-1035 label")
    specs = job.get("spec", {}).get("tfReplicaSpecs") or {}
    if not specs:
        errors.append(f"{where}: spec.tfReplicaSpecs is required")
    chiefs = 0
    for rtype, spec in specs.items():
        if rtype not in ("PS", "Worker", "Chief", "Master", "Evaluator"):
            errors.append(f"{where}: replica type {rtype!r} is not one of PS, Worker, Chief, Master, Evaluator")
        chiefs += rtype in ("Chief", "Master")
        containers = ((spec or {}).get("template", {}).get("spec", {}) or {}).get("containers") or []
        if not any(c.get("name") == "tensorflow" for c in containers):
            errors.append(f"{where}: {rtype}: no container named tensorflow")
        if any(not c.get("image") for c in containers):
            errors.append(f"{where}: {rtype}: a container without an image")
        if spec.get("restartPolicy") not in ("ExitCode",):
            errors.append(f"{where}: {rtype}: restartPolicy {spec.get('restartPolicy')!r}: dtf's exit 78 "
                          "is retried by anything but ExitCode")
        # Each pod template as Kubernetes itself would take it.
        template = {"apiVersion": "v1", "kind": "PodTemplate",
                    "metadata": {"name": f"{name}-{rtype.lower()}"}, "template": spec.get("template", {})}
        errors += validate_k8s(template, f"{where}: {rtype} pod template")
    if chiefs > 1:
        errors.append(f"{where}: more than 1 Chief or Master")
    return errors


def check_cluster(objs, config_text, where):
    """StatefulSet replicas and names against dtf.toml's cluster lists."""
    cluster = tomllib.loads(config_text).get("cluster", {})
    sets = {o["metadata"]["name"]: o for o in objs if o["kind"] == "StatefulSet"}
    errors = []

    def names(set_name, start=0):
        s = sets.get(set_name)
        if s is None:
            return []
        base = s["spec"].get("ordinals", {}).get("start", 0)
        if base != start:
            errors.append(f"{where}: StatefulSet {set_name}: ordinals start at {base}, task indices at {start}")
        n = s["spec"].get("replicas", 1)
        return [f"{set_name}-{i}.{s['spec']['serviceName']}:2222" for i in range(base, base + n)]

    ps = names("dtf-ps")
    workers = names("dtf-chief") + names("dtf-worker", start=1)
    if cluster.get("ps") != ps:
        errors.append(f"{where}: dtf.toml cluster.ps = {cluster.get('ps')}, the StatefulSets make {ps}")
    if cluster.get("worker") != workers:
        errors.append(f"{where}: dtf.toml cluster.worker = {cluster.get('worker')}, the StatefulSets make {workers}")
    if sets.get("dtf-chief", {}).get("spec", {}).get("replicas", 1) != 1:
        errors.append(f"{where}: StatefulSet dtf-chief must have 1 replica (worker 0)")
    for s in sets.values():
        svc = [o for o in objs if o["kind"] == "Service" and o["metadata"]["name"] == s["spec"]["serviceName"]]
        if not svc or svc[0]["spec"].get("clusterIP") != "None":
            errors.append(f"{where}: StatefulSet {s['metadata']['name']}: no headless Service {s['spec']['serviceName']}")
    # The ports the pods declare (and the NetworkPolicy and probes name) are
    # the ones dtf.toml makes them listen on.
    ps_ports, metrics_port = toml_ports(config_text)
    for s in sets.values():
        for c in s["spec"]["template"]["spec"]["containers"]:
            for p in c.get("ports", []):
                want = {"grpc": ps_ports, "metrics": {metrics_port}}.get(p.get("name"))
                if want is not None and p["containerPort"] not in want:
                    errors.append(f"{where}: StatefulSet {s['metadata']['name']}: container port {p['name']} "
                                  f"is {p['containerPort']}, dtf.toml has it listen on {sorted(want)}")
    return errors


def toml_ports(config_text):
    """The ps's ports (cluster.ps) and the metrics port (metrics.listen) of a dtf.toml."""
    config = tomllib.loads(config_text)
    ps = {int(a.rpartition(":")[2]) for a in config.get("cluster", {}).get("ps", [])}
    listen = config.get("metrics", {}).get("listen", "")
    return ps, (int(listen.rpartition(":")[2]) if listen else None)


def role_pods(objs):
    """Each StatefulSet's pod template by its component label (ps, chief,
    worker, evaluator)."""
    return {o["spec"]["template"]["metadata"]["labels"].get("app.kubernetes.io/component", o["metadata"]["name"]):
            o["spec"]["template"] for o in objs if o["kind"] == "StatefulSet"}


def check_files(objs, config_text, where):
    """Every file or directory dtf.toml names is on a volume of each pod
    that reads it (the data read-only), or in the image."""
    config = tomllib.loads(config_text)
    security, data = config.get("security", {}), config.get("data", {})
    calls_ps = ["ps", "chief", "worker"]
    # With model.hidden a ps reads the data for the model's widths (preflight).
    reads_data = ["chief", "worker", "evaluator"] + (["ps"] if "hidden" in config.get("model", {}) else [])
    wanted = [(f"security.{k}", security.get(k), calls_ps, False)
              for k in ("token_file", "tls_cert", "tls_key", "tls_ca")]
    wanted.append(("checkpoint.dir", config.get("checkpoint", {}).get("dir"), ["chief", "evaluator"], False))
    wanted += [(f"data.{k}", data.get(k), reads_data, True) for k in ("dir", "path", "train", "test")]
    pods = role_pods(objs)
    errors = []
    for key, path, roles, read_only in wanted:
        if not path or path.startswith(IMAGE_PATHS):
            continue
        for role in roles:
            if role not in pods:
                continue
            mounts = [m for c in pods[role]["spec"]["containers"] for m in c.get("volumeMounts", [])
                      if path == m["mountPath"] or path.startswith(m["mountPath"].rstrip("/") + "/")]
            if not mounts:
                errors.append(f"{where}: dtf.toml {key} = {path!r}, but no volume of the {role} pod is mounted there")
            elif read_only and not any(m.get("readOnly") for m in mounts):
                errors.append(f"{where}: dtf.toml {key} = {path!r}: the {role} pod mounts it writable; "
                              "the data set is mounted read-only")
    return errors


# --- NetworkPolicy --------------------------------------------------------


def selects(selector, labels):
    """Whether a Kubernetes label selector matches `labels` (an empty one
    matches everything)."""
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for e in selector.get("matchExpressions") or []:
        has, values = e["key"] in labels, e.get("values") or []
        ok = {"In": has and labels.get(e["key"]) in values,
              "NotIn": not (has and labels.get(e["key"]) in values),
              "Exists": has, "DoesNotExist": not has}[e["operator"]]
        if not ok:
            return False
    return True


def admits(policies, src, dst, port, namespace, src_namespace=None):
    """Whether a pod labelled `src` in `src_namespace` (default: the
    cluster's) may connect to `port` of the pod template `dst`: None when
    no policy selects `dst` (it takes anything), else True or False."""
    src_namespace = src_namespace or namespace
    labels = dst["metadata"]["labels"]
    selecting = [p for p in policies if selects(p["spec"].get("podSelector") or {}, labels)
                 and "Ingress" in p["spec"].get("policyTypes", ["Ingress"])]
    if not selecting:
        return None
    named = {p["name"]: p["containerPort"] for c in dst["spec"]["containers"] for p in c.get("ports", [])}
    for p in selecting:
        for rule in p["spec"].get("ingress") or []:
            ports = [named.get(q.get("port"), q.get("port")) for q in rule.get("ports") or []]
            if ports and port not in ports:
                continue
            peers = rule.get("from") or []
            if not peers:
                return True
            for peer in peers:
                if "ipBlock" in peer:
                    # Pod addresses are not known here: any pod's may be in it.
                    return True
                ns = peer.get("namespaceSelector")
                in_ns = (src_namespace == namespace) if ns is None else \
                    selects(ns, {"kubernetes.io/metadata.name": src_namespace})
                if in_ns and selects(peer.get("podSelector") or {}, src):
                    return True
    return False


def check_network_policy(objs, config_text, where):
    """The NetworkPolicy admits the ps, chief and workers to the ps's port,
    no other pod, only dtf.toml's ports, and a Prometheus to /metrics."""
    policies = [o for o in objs if o["kind"] == "NetworkPolicy"]
    pods = role_pods(objs)
    if not policies:
        return [f"{where}: no NetworkPolicy: every pod takes connections from any pod of the cluster"]
    namespace = policies[0]["metadata"].get("namespace", "default")
    ps_ports, metrics_port = toml_ports(config_text)
    named = {c["name"]: c["containerPort"] for pod in pods.values()
             for k in pod["spec"]["containers"] for c in k.get("ports", [])}
    errors = []
    for p in policies:
        name = p["metadata"]["name"]
        if not any(selects(p["spec"].get("podSelector") or {}, pod["metadata"]["labels"]) for pod in pods.values()):
            errors.append(f"{where}: NetworkPolicy {name}: its podSelector matches no dtf pod")
        for i, rule in enumerate(p["spec"].get("ingress") or []):
            for q in rule.get("ports") or []:
                number = named.get(q.get("port"), q.get("port"))
                if number not in ps_ports | {metrics_port}:
                    errors.append(f"{where}: NetworkPolicy {name}: ingress[{i}] opens port {q.get('port')}, "
                                  f"neither a ps's port in cluster.ps {sorted(ps_ports)} nor metrics.listen's "
                                  f"{metrics_port}")
            for peer in rule.get("from") or []:
                if "podSelector" in peer and "namespaceSelector" not in peer and not any(
                        selects(peer["podSelector"], pod["metadata"]["labels"]) for pod in pods.values()):
                    errors.append(f"{where}: NetworkPolicy {name}: ingress[{i}] admits a podSelector that "
                                  "matches no dtf pod")
    for role, pod in pods.items():
        if admits(policies, {}, pod, metrics_port, namespace) is None:
            errors.append(f"{where}: no NetworkPolicy selects the {role} pod: it takes connections from any pod")
    stranger = {"app.kubernetes.io/name": "other"}
    for port in sorted(ps_ports):
        for role in ("ps", "chief", "worker", "evaluator"):
            if role not in pods or "ps" not in pods:
                continue
            labels = pods[role]["metadata"]["labels"]
            allowed = admits(policies, labels, pods["ps"], port, namespace)
            needed = role != "evaluator"
            if needed and allowed is False:
                errors.append(f"{where}: the NetworkPolicy refuses the {role} pods the ps's port {port}")
            if not needed and allowed:
                errors.append(f"{where}: the NetworkPolicy admits the {role} pods to the ps's port {port}: "
                              "it calls no ps")
        if "ps" in pods and admits(policies, stranger, pods["ps"], port, namespace):
            errors.append(f"{where}: the NetworkPolicy admits any pod of the namespace to the ps's port {port}")
        if "ps" in pods and admits(policies, pods["ps"]["metadata"]["labels"], pods["ps"], port, namespace, "elsewhere"):
            errors.append(f"{where}: the NetworkPolicy admits another namespace's dtf pods to the ps's port {port}")
    for role, pod in pods.items():
        if admits(policies, stranger, pod, metrics_port, namespace):
            errors.append(f"{where}: the NetworkPolicy admits any pod of the namespace to the {role} pods' /metrics")
    scraped = False
    for p in policies:
        for rule in p["spec"].get("ingress") or []:
            ports = [named.get(q.get("port"), q.get("port")) for q in rule.get("ports") or []]
            if (not ports or metrics_port in ports) and any(
                    peer.get("namespaceSelector") is not None for peer in rule.get("from") or []):
                scraped = True
    if not scraped:
        errors.append(f"{where}: the NetworkPolicy admits no Prometheus (a peer with a namespaceSelector) to "
                      f"/metrics on port {metrics_port}")
    return errors


def check_all(root, secrets, kubectl=True):
    """Every check of the manifests under `root`; `kubectl`: compare each
    render with kubectl kustomize's (the self-test's broken copies skip it:
    it checks this renderer, not the manifests)."""
    errors = []
    schema = crd_schema()
    for dirpath, dirnames, files in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in ("vendor", "secrets", "patches")]
        for f in sorted(files):
            if not f.endswith(".yaml") or f == "kustomization.yaml":
                continue
            path = os.path.join(dirpath, f)
            for doc in load_docs(path):
                where = f"{os.path.relpath(path, root)}: {doc.get('kind')} {doc.get('metadata', {}).get('name')}"
                if doc.get("kind") == "TFJob":
                    errors += check_tfjob(doc, where, schema)
                else:
                    errors += validate_k8s(doc, where)
    variants = {"": root}
    tls = make_variant(root, ["tls", "tls-ps-probes"], tls_toml)
    data = make_variant(root, ["data"], data_toml)
    variants["(with TLS)"] = tls
    variants["(with your data)"] = data
    variants["tfjob"] = os.path.join(root, "tfjob")
    for label, directory in variants.items():
        try:
            objs = render(directory, secrets)
        except Failure as e:
            errors.append(str(e))
            continue
        for o in objs:
            where = f"kustomize {label or '.'}: {o['kind']} {o['metadata']['name']}"
            errors += check_tfjob(o, where, schema) if o["kind"] == "TFJob" else validate_k8s(o, where)
        config = next((o["data"]["dtf.toml"] for o in objs if o["kind"] == "ConfigMap"), None)
        if label != "tfjob":
            where = f"kustomize {label or '.'}"
            errors += check_cluster(objs, config, where)
            errors += check_files(objs, config, where)
            errors += check_network_policy(objs, config, where)
        if kubectl:
            errors += compare_with_kubectl(directory, objs, secrets, label or ".")
    shutil.rmtree(tls, ignore_errors=True)
    shutil.rmtree(data, ignore_errors=True)
    return errors


def make_variant(root, patches, edit_toml):
    """A copy of the kustomization with the commented patches/NAME.yaml
    lines of `patches` (and their target) enabled, and dtf.toml edited by
    `edit_toml`, as docs/deploy.md tells a user to."""
    tmp = tempfile.mkdtemp(prefix="dtf-deploy-variant-")
    shutil.copytree(root, tmp, dirs_exist_ok=True)
    k = os.path.join(tmp, "kustomization.yaml")
    with open(k) as f:
        lines = f.read().split("\n")
    for i, line in enumerate(lines):
        m = re.fullmatch(r"  #(- path: patches/([\w-]+)\.yaml)", line)
        if m and m.group(2) in patches:
            lines[i] = "  " + m.group(1)
            if i + 1 < len(lines) and lines[i + 1].startswith("  #  target:"):
                lines[i + 1] = "  " + lines[i + 1][3:]
    text = "\n".join(lines)
    if "tls" in patches:
        text = re.sub(r"(?m)^#(  - name: dtf-tls|    files:|      - )", r"\1", text)
    with open(k, "w") as f:
        f.write(text)
    c = os.path.join(tmp, "dtf.toml")
    with open(c) as f:
        text = f.read()
    with open(c, "w") as f:
        f.write(edit_toml(text))
    return tmp


def tls_toml(text):
    """dtf.toml's tls_* lines uncommented."""
    return re.sub(r"(?m)^# (tls_\w+ = )", r"\1", text)


def data_toml(text):
    """dtf.toml's [data] pointed at the data volume: the image's dir line
    gone, the commented example keys uncommented."""
    text = re.sub(r'(?m)^dir = "/usr/share/datasets/[^"]*"\n', "", text)
    return re.sub(r'(?m)^# ((?:format|dir|path|train|test) = ")', r"\1", text)


def compare_with_kubectl(directory, objs, secrets, label):
    kubectl = shutil.which("kubectl")
    if not kubectl:
        print(f"note: no kubectl here: the render of {label} is not compared with kustomize's")
        return []
    tmp = tempfile.mkdtemp(prefix="dtf-deploy-kubectl-")
    try:
        shutil.copytree(directory, tmp, dirs_exist_ok=True)
        for path, content in secrets.items():
            os.makedirs(os.path.dirname(os.path.join(tmp, path)), exist_ok=True)
            with open(os.path.join(tmp, path), "w") as f:
                f.write(content)
        out = subprocess.run([kubectl, "kustomize", tmp], capture_output=True, text=True)
        if out.returncode != 0:
            return [f"kubectl kustomize {label}: {out.stderr.strip()}"]
        theirs = normalized([d for d in yaml.safe_load_all(out.stdout) if d])
        ours = normalized(objs)
        if theirs != ours:
            diff = sorted(set(theirs) ^ set(ours))
            return [f"kubectl kustomize {label} renders otherwise than this check: {d[:400]}" for d in diff]
        print(f"ok: kubectl kustomize {label} renders the same {len(objs)} objects")
        return []
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


SECRETS = {
    "secrets/token": "0123456789abcdef0123456789abcdef\n",
    "secrets/ca.crt": "-----BEGIN CERTIFICATE-----\n",
    "secrets/tls.crt": "-----BEGIN CERTIFICATE-----\n",
    "secrets/tls.key": "-----BEGIN PRIVATE KEY-----\n",
}


def self_test():
    """Each check must catch a mistake made on purpose."""
    cases = {
        "an unknown field in a StatefulSet": ("ps.yaml", lambda t: t.replace("  serviceName: dtf-ps", "  serviceName: dtf-ps\n  servceName: x")),
        "a gRPC probe on a named port (kubelet takes only a number)": ("ps.yaml", lambda t: t.replace("port: 2222\n              service:", "port: grpc\n              service:")),
        "a pod template field of the TFJob that Kubernetes does not have": ("tfjob/tfjob.yaml", lambda t: t.replace("terminationGracePeriodSeconds: 45", "terminationGraceSeconds: 45", 1)),
        "replicas not matching dtf.toml": ("kustomization.yaml", lambda t: t.replace("name: dtf-worker\n    count: 1", "name: dtf-worker\n    count: 2")),
        "a TFJob field the CRD does not have": ("tfjob/tfjob.yaml", lambda t: t.replace("  runPolicy:", "  runPolcy: {}\n  runPolicy:")),
        "a TFJob restartPolicy that retries 78": ("tfjob/tfjob.yaml", lambda t: t.replace("restartPolicy: ExitCode", "restartPolicy: OnFailure", 1)),
        "a TFJob container not named tensorflow": ("tfjob/tfjob.yaml", lambda t: t.replace("- name: tensorflow", "- name: tf", 1)),
        "a patch whose target is gone": ("kustomization.yaml", lambda t: t.replace("name: dtf-checkpoints", "name: dtf-gone")),
        "a field Kubernetes 1.27 does not have (Service trafficDistribution, 1.30)":
            ("ps.yaml", lambda t: t.replace("  publishNotReadyAddresses: true\n", "  publishNotReadyAddresses: true\n  trafficDistribution: PreferClose\n", 1)),
        "a field behind a feature gate off in Kubernetes 1.27 (hostUsers)":
            ("ps.yaml", lambda t: t.replace("      enableServiceLinks: false\n", "      enableServiceLinks: false\n      hostUsers: false\n", 1)),
        "a ps container port that is not cluster.ps's": ("ps.yaml", lambda t: t.replace("containerPort: 2222", "containerPort: 2223")),
        "a NetworkPolicy whose pod selector matches no dtf pod":
            ("networkpolicy.yaml", lambda t: t.replace("spec:\n  podSelector:\n    matchLabels:\n      app.kubernetes.io/name: dtf\n",
                                                       "spec:\n  podSelector:\n    matchLabels:\n      app.kubernetes.io/name: dft\n")),
        "a NetworkPolicy port that is not the ps's": ("networkpolicy.yaml", lambda t: t.replace("port: 2222", "port: 2223")),
        "a NetworkPolicy that admits the evaluator to the ps":
            ("networkpolicy.yaml", lambda t: t.replace("values: [ps, chief, worker]", "values: [ps, chief, worker, evaluator]")),
        "a NetworkPolicy rule open to every pod": ("networkpolicy.yaml", lambda t: t.replace(
            "        - podSelector:\n            matchLabels:\n              app.kubernetes.io/name: dtf\n", "        - podSelector: {}\n")),
        "the data volume mounted elsewhere than dtf.toml's [data] names": ("patches/data.yaml", lambda t: t.replace("mountPath: /data", "mountPath: /mnt/data")),
        "the data volume mounted writable": ("patches/data.yaml", lambda t: t.replace("    mountPath: /data\n    readOnly: true", "    mountPath: /data\n    readOnly: false")),
        "the TLS Secret mounted elsewhere than security.tls_* name":
            ("patches/tls.yaml", lambda t: t.replace("mountPath: /run/secrets/dtf-tls", "mountPath: /run/secrets/tls")),
    }
    failed = []
    for what, (file, mutate) in cases.items():
        tmp = tempfile.mkdtemp(prefix="dtf-deploy-selftest-")
        try:
            shutil.copytree(ROOT, tmp, dirs_exist_ok=True)
            path = os.path.join(tmp, file)
            with open(path) as f:
                before = f.read()
            after = mutate(before)
            if after == before:
                failed.append(f"self-test {what}: the mutation did not apply to {file}")
                continue
            with open(path, "w") as f:
                f.write(after)
            errors = check_all(tmp, SECRETS, kubectl=False)
            if errors:
                print(f"ok: self-test caught {what}: {errors[0][:160]}")
            else:
                failed.append(f"self-test: {what} was not caught")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return failed


# --- scripts/make-tls-cert.sh ----------------------------------------------

SCRIPT = os.path.normpath(os.path.join(ROOT, "..", "..", "scripts", "make-tls-cert.sh"))


def openssl(*args):
    out = subprocess.run(["openssl", *args], capture_output=True, text=True)
    return out.returncode, (out.stdout + out.stderr).strip()


def cert_names(objs):
    """The names every ps must be reachable as under TLS: each host of
    cluster.ps as dtf.toml dials it, and its qualified forms."""
    config = tomllib.loads(next(o["data"]["dtf.toml"] for o in objs if o["kind"] == "ConfigMap"))
    namespace = next(o["metadata"]["namespace"] for o in objs if o["kind"] == "StatefulSet")
    names = []
    for addr in config["cluster"]["ps"]:
        host = addr.rpartition(":")[0]
        names += [host, f"{host}.{namespace}.svc", f"{host}.{namespace}.svc.cluster.local"]
    return names


def check_certificate(directory, names):
    """tls.crt in `directory`, as the tasks will use it: signed by ca.crt,
    naming each of `names` for a TLS client (serverAuth), usable as a client
    (clientAuth), and tls.key its key."""
    errors = []
    crt, key, ca = (os.path.join(directory, f) for f in ("tls.crt", "tls.key", "ca.crt"))
    rc, text = openssl("x509", "-in", crt, "-noout", "-ext", "subjectAltName,extendedKeyUsage,keyUsage")
    if rc != 0:
        return [f"{crt}: not a certificate: {text}"]
    for usage in ("TLS Web Server Authentication", "TLS Web Client Authentication"):
        if usage not in text:
            errors.append(f"{crt}: extended key usage lacks {usage}: each pod presents it as "
                          f"{'a ps' if 'Server' in usage else 'a client of the ps'}")
    if "Digital Signature" not in text:
        errors.append(f"{crt}: key usage lacks digitalSignature (the TLS handshake's signature)")
    for name in names:
        if f"DNS:{name}" not in text:
            errors.append(f"{crt}: subjectAltName does not name {name}")
        rc, out = openssl("verify", "-CAfile", ca, "-purpose", "sslserver", "-verify_hostname", name, crt)
        if rc != 0:
            errors.append(f"{crt}: as the ps {name}, refused: {out.splitlines()[-1] if out else rc}")
    rc, out = openssl("verify", "-CAfile", ca, "-purpose", "sslclient", crt)
    if rc != 0:
        errors.append(f"{crt}: as a client, refused: {out.splitlines()[-1] if out else rc}")
    _, cert_pub = openssl("x509", "-in", crt, "-noout", "-pubkey")
    rc, key_pub = openssl("pkey", "-in", key, "-pubout")
    if rc != 0 or cert_pub != key_pub:
        errors.append(f"{key}: not the key of {crt}")
    return errors


def make_cert(directory, ps, namespace):
    out = subprocess.run(["sh", SCRIPT, "--ps", str(ps), "--namespace", namespace, directory],
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise Failure(f"{SCRIPT} --ps {ps} --namespace {namespace}: {out.stderr.strip()}")
    if f"kubectl -n {namespace} create secret generic dtf-tls" not in out.stdout:
        raise Failure(f"{SCRIPT}: prints no kubectl create secret command for namespace {namespace}")


def check_certificates(self_test):
    """scripts/make-tls-cert.sh's certificate for this kustomization (and
    for more ps tasks in another namespace) passes check_certificate; with
    --self-test, check_certificate first refuses certificates made wrong on
    purpose."""
    objs = render(ROOT, SECRETS)
    failed = []
    tmp = tempfile.mkdtemp(prefix="dtf-deploy-cert-")
    try:
        ps = next(o["spec"]["replicas"] for o in objs if o["kind"] == "StatefulSet" and o["metadata"]["name"] == "dtf-ps")
        namespace = next(o["metadata"]["namespace"] for o in objs if o["kind"] == "StatefulSet")
        here = os.path.join(tmp, "here")
        make_cert(here, ps, namespace)
        failed += check_certificate(here, cert_names(objs))
        three = os.path.join(tmp, "three")
        make_cert(three, 3, "ml")
        names3 = [n for i in range(3) for n in (f"dtf-ps-{i}.dtf-ps", f"dtf-ps-{i}.dtf-ps.ml.svc",
                                                 f"dtf-ps-{i}.dtf-ps.ml.svc.cluster.local")]
        failed += check_certificate(three, names3)
        if not failed:
            print(f"ok: scripts/make-tls-cert.sh: {len(cert_names(objs))} names for {ps} ps in {namespace}, "
                  f"{len(names3)} for 3 in ml; serverAuth, clientAuth, its key, its CA")
        if self_test:
            cases = {"a certificate for fewer ps tasks than the cluster has": (three, names3 + ["dtf-ps-3.dtf-ps"])}
            # Made by hand, signed by the same CA: serverAuth only (what
            # many recipes give), and a key that is not the certificate's.
            bad = os.path.join(tmp, "bad")
            os.makedirs(bad)
            shutil.copy(os.path.join(three, "ca.crt"), bad)
            with open(os.path.join(bad, "ext"), "w") as f:
                f.write("extendedKeyUsage=serverAuth\nkeyUsage=digitalSignature\n"
                        "subjectAltName=" + ",".join(f"DNS:{n}" for n in names3) + "\n")
            rc, out = openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-subj", "/CN=x",
                              "-keyout", os.path.join(bad, "tls.key"), "-out", os.path.join(bad, "tls.csr"))
            rc2, out2 = openssl("x509", "-req", "-in", os.path.join(bad, "tls.csr"), "-CA", os.path.join(three, "ca.crt"),
                                "-CAkey", os.path.join(three, "ca.key"), "-days", "1", "-extfile", os.path.join(bad, "ext"),
                                "-out", os.path.join(bad, "tls.crt"))
            if rc or rc2:
                failed.append(f"self-test: openssl could not make the server-only certificate: {out} {out2}")
            cases["a certificate without clientAuth"] = (bad, names3)
            swapped = os.path.join(tmp, "swapped")
            shutil.copytree(three, swapped)
            shutil.copy(os.path.join(here, "tls.key"), os.path.join(swapped, "tls.key"))
            cases["a key that is not the certificate's"] = (swapped, names3)
            foreign = os.path.join(tmp, "foreign")
            shutil.copytree(three, foreign)
            shutil.copy(os.path.join(here, "ca.crt"), os.path.join(foreign, "ca.crt"))
            cases["a certificate another CA signed"] = (foreign, names3)
            for what, (directory, names) in cases.items():
                errors = check_certificate(directory, names)
                if errors:
                    print(f"ok: self-test caught {what}: {errors[0][:160]}")
                else:
                    failed.append(f"self-test: {what} was not caught")
    except Failure as e:
        failed.append(str(e))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return failed


def main():
    failed = []
    if "--self-test" in sys.argv:
        failed += self_test()
    failed += check_certificates("--self-test" in sys.argv)
    errors = check_all(ROOT, SECRETS)
    for e in failed + errors:
        print(f"FAIL {e}")
    if failed or errors:
        print(f"check-deploy: {len(failed) + len(errors)} problem(s)")
        return 1
    print(f"check-deploy: OK (Kubernetes {', '.join(VERSIONS)}; TFJob CRD {os.path.relpath(CRD, ROOT)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
