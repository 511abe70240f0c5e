"""Shared building blocks of the components (one floor down, public names).

Components import from here, never from each other's `core` or `_private` modules:
`storage` (gs:// <-> /gcs/ paths, the Cloud Storage client),
`files` (sha256, atomic writes, verified copies),
`swift` (ms-swift's command line: `to_cli`, `swift_executable`, `run_command`, `SigtermForwarder`),
`adapter` (the adapter folder train-lora writes and merge-export reads: file names, `summarize_log`),
`answers` (parsing model answers: fenced JSON, detection findings),
`reference` (what evaluate compares the tuned model with: kinds and the decision),
`snapshot` (data snapshots: fingerprint, verified reads, diffs, the data lineage file),
`model_sources` (hf:// / ms:// / gs:// / local model sources: parsing, tokens, hub resolution),
`registry` (the champion check before a run acts on the Model Registry or an endpoint),
`dataset` (the validated dataset's token figures),
`retry` (which failures are transient, bounded backoff: GCS reads, HTTP fetches, hub calls),
`progress` (long steps' progress as rate-limited log lines: one per 5 % or 30 s, whichever comes later),
`boxes` / `tasks` (box conventions, the task registry),
`report` (the HTML reports' jinja2 templates, matplotlib figures as inline SVG, data: URIs),
`provenance` (a clean row's origin: the user's file, line and image names),
`errors` (`TrainError`, the training job's error type), `cluster` (where a node sits: Vertex's CLUSTER_SPEC or a
JobSet's environment, the node's GPUs: train-lora's launcher and the preflight read it),
`preflight` (the GPU / NCCL health check train-lora runs on every node: `python -m components.common.preflight`).
"""
