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
   cluster.worker, each address the pod's own stable name.

The kustomizations are rendered here (kustomize's features that they use:
resources, namespace, images, replicas, generators, JSON patches with a
target); a key this renderer does not know is an error, so a kustomization
never passes unchecked. Where `kubectl` is installed, its `kustomize` output
is compared with this renderer's.

--self-test first breaks copies of the manifests in ways each check must
catch, and fails if one is not caught.
"""

import copy
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
# StatefulSet ordinals (GA) and unhealthyPodEvictionPolicy are 1.31; the
# newest schemas the package ships.
VERSIONS = ["1.31.0", "1.37.0"]
KUSTOMIZE_KEYS = {
    "apiVersion", "kind", "namespace", "resources", "images", "replicas",
    "configMapGenerator", "secretGenerator", "generatorOptions", "patches",
}


class Failure(Exception):
    pass


def load_docs(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


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
    return errors


def check_all(root, secrets):
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
    tls = make_tls_variant(root)
    variants["(with TLS)"] = tls
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
            errors += check_cluster(objs, config, f"kustomize {label or '.'}")
        errors += compare_with_kubectl(directory, objs, secrets, label or ".")
    shutil.rmtree(tls, ignore_errors=True)
    return errors


def make_tls_variant(root):
    """A copy of the kustomization with its commented TLS lines enabled, as
    docs/deploy.md tells a user to."""
    tmp = tempfile.mkdtemp(prefix="dtf-deploy-tls-")
    shutil.copytree(root, tmp, dirs_exist_ok=True)
    k = os.path.join(tmp, "kustomization.yaml")
    with open(k) as f:
        text = f.read()
    text = re.sub(r"(?m)^  #(- path: patches/tls|  target:)", r"  \1", text)
    text = re.sub(r"(?m)^#(  - name: dtf-tls|    files:|      - )", r"\1", text)
    with open(k, "w") as f:
        f.write(text)
    c = os.path.join(tmp, "dtf.toml")
    with open(c) as f:
        text = f.read()
    with open(c, "w") as f:
        f.write(re.sub(r"(?m)^# (tls_\w+ = )", r"\1", text))
    return tmp


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
            errors = check_all(tmp, SECRETS)
            if errors:
                print(f"ok: self-test caught {what}: {errors[0][:160]}")
            else:
                failed.append(f"self-test: {what} was not caught")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return failed


def main():
    failed = []
    if "--self-test" in sys.argv:
        failed += self_test()
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
