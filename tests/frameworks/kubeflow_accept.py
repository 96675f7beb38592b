"""Read placer's pytorchjob.yaml into the Kubeflow Training SDK's own PyTorchJob model.

``python kubeflow_accept.py MANIFEST.json``; each case ``{"id", "dir"}``. The SDK
(kubeflow-training, the Training Operator v1 API's generated client) deserialises the document
into ``KubeflowOrgV1PyTorchJob`` with the Kubernetes client's pod types, checking required
fields and types; a field the API does not define is dropped by that deserialiser, so the
document is serialised back and must come out unchanged. Prints one JSON line per case.
No stubs.
"""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path
from typing import Any

import yaml


class _Response:
    """What ApiClient.deserialize reads: the body of an API response."""

    def __init__(self, data: Any) -> None:
        self.data = json.dumps(data)


def check(case: dict[str, Any]) -> dict[str, Any]:
    from kubeflow.training import ApiClient

    document = yaml.safe_load(Path(case["dir"], "pytorchjob.yaml").read_text())
    client = ApiClient()
    try:
        job = client.deserialize(_Response(document), "KubeflowOrgV1PyTorchJob")
    except (ValueError, TypeError) as exc:
        return {"id": case["id"], "error": f"{type(exc).__name__}: {exc}"}
    back = client.sanitize_for_serialization(job)
    specs = job.spec.pytorch_replica_specs
    return {"id": case["id"], "round_trip": back == document, "back": back,
            "name": job.metadata.name, "kind": job.kind, "api_version": job.api_version,
            "replicas": {k: v.replicas for k, v in specs.items()},
            "nproc_per_node": job.spec.nproc_per_node}


def main() -> None:
    for case in json.loads(Path(sys.argv[1]).read_text()):
        try:
            result = check(case)
        except Exception:
            result = {"id": case["id"], "error": traceback.format_exc()}
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
