"""The CustomJob that GCPC's launcher sends for a compiled train-lora task, rebuilt offline.

GCPC 2.22's CustomJob executor takes `--payload`, a JSON template with
`{{$.inputs.parameters['NAME']}}` placeholders; at run time the launcher fills them with the
task's inputs, drops empty fields (`json_util.recursive_remove_empty`), drops
`max_wait_duration` unless the strategy is FLEX_START (`remote_runner.create_custom_job_with_client`)
and sends the rest as a `CustomJob`. `custom_job` does the same from the compiled YAML (the
inputs' defaults, which a console run uses) and parses the result into
`google.cloud.aiplatform_v1.CustomJob` with unknown fields refused.
"""

from __future__ import annotations

import json
import re
from typing import Any

from google.cloud import aiplatform_v1
from google.protobuf import json_format
from google_cloud_pipeline_components.container.v1.gcp_launcher.utils import json_util

_PLACEHOLDER = re.compile(r"\{\{\$\.inputs\.parameters\['([a-z_]+)'\]\}\}")
_QUOTED = re.compile(r"\"\{\{\$\.inputs\.parameters\['([a-z_]+)'\]\}\}\"")


def payload_dict(raw: dict) -> dict[str, Any]:
    """The CustomJob body (a dict) the launcher would send for the compiled pipeline `raw`."""
    args = raw["deploymentSpec"]["executors"]["exec-train-lora"]["container"]["args"]
    template = args[args.index("--payload") + 1]
    params = raw["components"]["comp-train-lora"]["inputDefinitions"]["parameters"]

    def value(name: str) -> Any:
        default = params[name].get("defaultValue", "")
        # the persistent-resource default is a runtime placeholder ({{$.pipeline_persistent_resource_id}}),
        # empty when the run sets none
        return "" if isinstance(default, str) and default.startswith("{{$") else default

    text = _QUOTED.sub(lambda m: json.dumps(str(value(m.group(1)))), template)
    text = _PLACEHOLDER.sub(lambda m: json.dumps(value(m.group(1))), text)
    job = json_util.recursive_remove_empty(json.loads(text, strict=False))
    scheduling = job.get("job_spec", {}).get("scheduling", {})
    if scheduling.get("strategy") != "FLEX_START":
        scheduling.pop("max_wait_duration", None)
    return job


def custom_job(raw: dict) -> aiplatform_v1.CustomJob:
    """Parses the payload as `aiplatform_v1.CustomJob`; an unknown field raises `json_format.ParseError`."""
    message = aiplatform_v1.CustomJob.pb(aiplatform_v1.CustomJob())
    json_format.ParseDict(payload_dict(raw), message, ignore_unknown_fields=False)
    return aiplatform_v1.CustomJob.wrap(message)
