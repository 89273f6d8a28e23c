#!/usr/bin/env python3
"""Checks the RayJob manifests beside it: the RayJob's own fields against
the names and types of KubeRay's ray.io/v1 RayJob (the fields this example
uses), and every pod template it embeds against the Kubernetes API schema
with kubernetes-validate, as the other manifests of examples/kubernetes are.

    pip install kubernetes-validate==1.37.0
    python examples/kubernetes/ray/check_rayjob.py [MANIFEST.yaml ...]
"""
import glob
import os
import sys

import kubernetes_validate
import yaml

STR, INT, BOOL, MAP, LIST = str, int, bool, dict, list
# KubeRay's RayJob (ray.io/v1): the fields of spec, rayClusterSpec, the head
# and worker groups, and their types.
SPEC = {"entrypoint": STR, "runtimeEnvYAML": STR, "shutdownAfterJobFinishes": BOOL,
        "ttlSecondsAfterFinished": INT, "activeDeadlineSeconds": INT, "backoffLimit": INT,
        "submissionMode": STR, "jobId": STR, "metadata": MAP, "rayClusterSpec": MAP,
        "submitterPodTemplate": MAP, "entrypointNumCpus": (int, float),
        "entrypointNumGpus": (int, float), "entrypointResources": STR, "clusterSelector": MAP,
        "suspend": BOOL}
CLUSTER = {"rayVersion": STR, "headGroupSpec": MAP, "workerGroupSpecs": LIST,
           "enableInTreeAutoscaling": BOOL, "autoscalerOptions": MAP,
           "headServiceAnnotations": MAP, "suspend": BOOL}
HEAD = {"rayStartParams": MAP, "template": MAP, "serviceType": STR, "enableIngress": BOOL,
        "headService": MAP}
WORKER = {"groupName": STR, "replicas": INT, "minReplicas": INT, "maxReplicas": INT,
          "rayStartParams": MAP, "template": MAP, "scaleStrategy": MAP, "numOfHosts": INT,
          "idleTimeoutSeconds": INT, "suspend": BOOL}


def fields(obj, known, where, errors, required=()):
    if not isinstance(obj, dict):
        errors.append(f"{where}: expected a mapping")
        return
    for k in required:
        if k not in obj:
            errors.append(f"{where}.{k}: required")
    for k, v in obj.items():
        if k not in known:
            errors.append(f"{where}.{k}: not a field of KubeRay's RayJob")
        elif not isinstance(v, known[k]) or (known[k] is INT and isinstance(v, bool)):
            errors.append(f"{where}.{k}: expected {known[k]}, got {type(v).__name__}")


def template(t, where, errors):
    pod = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "check"},
           "template": t}
    try:
        kubernetes_validate.validate(pod, kubernetes_validate.latest_version(), strict=True)
    except kubernetes_validate.ValidationError as e:
        errors.append(f"{where}: {'.'.join(str(p) for p in e.path)}: {e.message}")


def check(doc, name):
    errors = []
    if doc.get("apiVersion") != "ray.io/v1" or doc.get("kind") != "RayJob":
        return [f"{name}: not a ray.io/v1 RayJob"]
    fields(doc["spec"], SPEC, "spec", errors, required=("entrypoint", "rayClusterSpec"))
    c = doc["spec"].get("rayClusterSpec", {})
    fields(c, CLUSTER, "spec.rayClusterSpec", errors, required=("headGroupSpec",))
    head = c.get("headGroupSpec", {})
    fields(head, HEAD, "spec.rayClusterSpec.headGroupSpec", errors,
           required=("rayStartParams", "template"))
    template(head.get("template", {}), "headGroupSpec.template", errors)
    for i, w in enumerate(c.get("workerGroupSpecs", [])):
        where = f"spec.rayClusterSpec.workerGroupSpecs[{i}]"
        fields(w, WORKER, where, errors, required=("groupName", "rayStartParams", "template"))
        if w.get("minReplicas", 0) > w.get("replicas", 0) or w.get("replicas", 0) > w.get("maxReplicas", 1 << 30):
            errors.append(f"{where}: minReplicas <= replicas <= maxReplicas does not hold")
        template(w.get("template", {}), where + ".template", errors)
    for k, v in head.get("rayStartParams", {}).items():
        if not isinstance(v, str):
            errors.append(f"headGroupSpec.rayStartParams.{k}: a string (KubeRay passes them as flags)")
    return [f"{name}: {e}" for e in errors]


def main(paths):
    paths = paths or sorted(glob.glob(os.path.join(os.path.dirname(os.path.abspath(__file__)), "*.yaml")))
    errors = []
    for p in paths:
        with open(p) as f:
            for doc in yaml.safe_load_all(f):
                if doc:
                    errors += check(doc, p)
    for e in errors:
        print(e, file=sys.stderr)
    print(f"{len(paths)} RayJob manifest(s): {len(errors)} error(s)")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
