"""The secrets sweep (issue 50): every string of every shipped config, every override form, every kind.

Each secret kind in `components.common.secrets` is put into every string field of every shipped
config (a YAML file), into every string, list and mapping field of the schema (a `section.key=value`
override), and through the real command line: the load or compile is refused, and the secret's
value appears in no message, log line, stdout / stderr or output file. A real secret travels as a
reference: a Secret Manager name is resolved inside stage-model at run time, against a local fake
of Secret Manager (and of Google's OAuth token endpoint) at the HTTP level.
"""

from __future__ import annotations

import base64
import copy
import dataclasses
import http.server
import json
import logging
import subprocess
import sys
import threading
import typing
from pathlib import Path

import pytest
import yaml

from components.common import secrets
from pipelines import _config_secrets
from pipelines.config import ConfigError, load_config, parse_overrides, shipped_configs
from pipelines.config._schema import SECTIONS

REPO = Path(__file__).resolve().parent.parent


def _kinds() -> dict[str, tuple[str, str]]:
    """{kind: (the value put into the field, the secret part that must never be shown)}."""
    tail = "Q7vX2mK9pL4rT8wZ"  # distinct per kind below, so one kind's leak never hides behind another's
    plain = {
        "hf": "hf_" + "aB3dE5gH7jK9mN1pQ3sT5vW7yZ9" + tail,
        "modelscope": "ms-1a2b3c4d-5e6f-7a8b-9c0d-1e2f3a4b5c6d",
        "github_pat": "github_pat_11ABCDEFG0" + tail + "_xyz",
        "ghp": "ghp_" + "R4nD0mGh" + tail + "Ab12",
        "gho": "gho_" + "R4nD0mGo" + tail + "Cd34",
        "sk": "sk-proj-" + "Zz9Yy8Xx7Ww6" + tail,
        "slack": "xoxb-1234567890-" + tail,
        "google_api": "AIza" + "SyA1b2C3d4E5f6G7h8I9j0K" + tail[:12],
        "gitlab": "glpat-" + "Ab1Cd2Ef3Gh4" + tail,
        "aws_akia": "AKIA" + "Q7VX2MK9PL4RT8WZ",
        "aws_asia": "ASIA" + "Z8WT4RL9KM2XV7Q1",
    }
    kinds = {k: (v, v) for k, v in plain.items()}
    password = "pW0rd-" + tail
    kinds["url_userinfo"] = (f"https://alice:{password}@example.com/data/train.jsonl", password)
    for name in ("token", "access_token", "key", "sig", "X-Goog-Signature", "password", "secret"):
        value = "qv" + name.replace("_", "").replace("-", "")[:4] + tail
        kinds[f"url_query_{name}"] = (f"https://example.com/data/train.jsonl?alt=media&{name}={value}", value)
    return kinds


KINDS = _kinds()
HIGH_ENTROPY = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYzq84HkEYa"  # an AWS secret key's shape: free-text fields only


def _string_leaves(value: typing.Any, path: tuple) -> typing.Iterator[tuple]:
    """(path, value) of every string in a loaded YAML tree; list items and mapping values included."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _string_leaves(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _string_leaves(v, (*path, i))
    elif isinstance(value, str):
        yield path, value


def _set(tree: typing.Any, path: tuple, value: str) -> None:
    for part in path[:-1]:
        tree = tree[part]
    tree[path[-1]] = value


def _dotted(path: tuple) -> str:
    return ".".join(str(p) for p in path if not isinstance(p, int))


def _assert_refused_unechoed(call: typing.Callable[[], typing.Any], secret: str, key: str, capfd, caplog) -> str:
    with pytest.raises(ConfigError) as info:
        call()
    msg = str(info.value)
    out = capfd.readouterr()
    assert secret not in msg + out.out + out.err + caplog.text, (key, msg)
    assert "\n" not in msg and "not echoed" in msg and f"'{key}" in msg, msg
    return msg


CONFIGS = shipped_configs()


def _fields_of_shipped_configs() -> list[tuple[Path, tuple]]:
    """(config, path) of every string field of the shipped configs, each field once (in the first config that has it)."""
    seen, out = set(), []
    for config in CONFIGS:
        for path, _ in _string_leaves(yaml.safe_load(config.read_text()), ()):
            if path not in seen and _dotted(path) != "model.token_from":
                seen.add(path)
                out.append((config, path))
    return out


def test_every_string_of_the_shipped_configs_with_each_kind_is_refused_unechoed(tmp_path, capfd, caplog):
    caplog.set_level(logging.DEBUG)
    fields = _fields_of_shipped_configs()
    assert len(fields) >= 30  # the sweep covers the configs' fields, not a handful
    trees = {config: yaml.safe_load(config.read_text()) for config in CONFIGS}
    refused = 0
    for config, path in fields:
        key = _dotted(path)
        cases = [(kind, *KINDS[kind]) for kind in KINDS]
        if _config_secrets._free(key):
            cases.append(("high_entropy", HIGH_ENTROPY, HIGH_ENTROPY))
        for kind, value, secret in cases:
            tree = copy.deepcopy(trees[config])
            _set(tree, path, value)
            bad = tmp_path / f"{config.stem}.yaml"
            bad.write_text(yaml.safe_dump(tree, sort_keys=False))
            msg = _assert_refused_unechoed(lambda bad=bad: load_config(bad), secret, key, capfd, caplog)
            assert msg.startswith(f"{bad}:"), (kind, msg)  # file:line first
            refused += 1
    assert refused >= len(fields) * len(KINDS)


def _schema_fields() -> list[tuple[str, typing.Any]]:
    """Every string, list-of-strings and mapping field of every section of the schema."""
    out = []
    for section, cls in SECTIONS.items():
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            tp = hints[f.name]
            if tp is str or typing.get_origin(tp) in (list, dict):
                out.append((f"{section}.{f.name}", tp))
    return out


def _override_text(tp: typing.Any, value: str) -> str:
    quoted = json.dumps(value)  # a JSON string is a YAML scalar: URLs with ':' and '&' stay one value
    if typing.get_origin(tp) is list:
        return f"[{quoted}]"
    if typing.get_origin(tp) is dict:
        return "{LABEL_OR_VAR: " + quoted + "}"
    return quoted


# Also the free-form sections and non-string fields: a secret typed where a number or a flag belongs.
EXTRA_OVERRIDES = [
    ("swift.system", str),
    ("swift.report_to", list[str]),
    ("swift.model_type", str),
    ("environment.NCCL_DEBUG", str),
    ("pipeline.enable_caching", str),
    ("eval.max_new_tokens", str),
    ("resources.boot_disk_gb", str),
]


def test_every_override_of_every_field_with_each_kind_is_refused_unechoed(capfd, caplog):
    caplog.set_level(logging.DEBUG)
    config = REPO / "configs" / "qwen3_vl_4b" / "lora_seed.yaml"
    fields = _schema_fields() + EXTRA_OVERRIDES
    assert len(fields) > 40
    for key, tp in fields:
        if key == "model.token_from":
            continue
        free = _config_secrets._free(key)
        for kind, value, secret in [
            *((k, *v) for k, v in KINDS.items()),
            *([("high_entropy", HIGH_ENTROPY, HIGH_ENTROPY)] if free else []),
        ]:
            item = f"{key}={_override_text(tp, value)}"

            def load(item=item):
                return load_config(config, parse_overrides([item]))

            msg = _assert_refused_unechoed(load, secret, key, capfd, caplog)
            assert f"(override {key}=...)" in msg, (kind, msg)  # names the override, never repeats its text


def test_token_from_in_clear_is_refused_unechoed_in_both_forms(tmp_path, capfd, caplog):
    for kind in ("hf", "ghp", "sk", "aws_akia"):
        value, secret = KINDS[kind]
        with pytest.raises(ConfigError) as info:
            load_config(CONFIGS[0], parse_overrides([f"model.token_from={value}"]))
        assert secret not in str(info.value) and "token itself" in str(info.value)


def test_the_mask_shows_kind_key_and_at_most_four_characters():
    value, _ = KINDS["ghp"]
    with pytest.raises(ConfigError) as info:
        load_config(CONFIGS[0], parse_overrides([f"register.display_name={value}"]))
    msg = str(info.value)
    assert "GitHub token" in msg and "'register.display_name'" in msg and f"ending '{value[-4:]}'" in msg
    for i in range(len(value) - 4):  # no 5 consecutive characters of the value
        assert value[i : i + 5] not in msg.replace("ghp_", "")


def test_a_malformed_override_with_a_token_is_not_echoed():
    value, secret = KINDS["sk"]
    for item in (f"no_dot_key={value}", f"eval.metric=[{value}", f"{value}"):
        with pytest.raises(ConfigError) as info:
            parse_overrides([item])
        assert secret not in str(info.value), str(info.value)


def test_plain_values_still_load():
    """No false alarm on the shipped configs and on names, paths, hashes and references."""
    for config in CONFIGS:
        load_config(config)
    ok = [
        "model.revision=0123456789abcdef0123456789abcdef01234567",  # a commit: a hash, not free text
        "model.token_from=projects/p/secrets/hf-token/versions/3",
        "model.token_from=env:HF_TOKEN",
        "data.train=gs://my-bucket/data/drawings-2026/train-*.jsonl",
        "tracking.mlflow_uri=http://127.0.0.1:5000/?experiment=demo",
        "register.display_name=Qwen3-VL 4B drawings (LoRA rank 8, lr 1e-4)",
        "register.serving_args=[--max-model-len, '4096', --served-model-name, tuned]",
    ]
    for item in ok:
        load_config(CONFIGS[0], parse_overrides([item]))


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pipelines.cli", *args], cwd=REPO, capture_output=True, text=True, timeout=120
    )


# One command per kind: the real CLI, alternating the file and the override form.
@pytest.mark.parametrize("kind", sorted(KINDS), ids=str)
def test_cli_compile_refuses_each_kind_without_printing_or_writing_it(kind, tmp_path):
    value, secret = KINDS[kind]
    out = tmp_path / "out" / "p.yaml"
    config = REPO / "configs" / "qwen3_vl_4b" / "lora_seed.yaml"
    if sorted(KINDS).index(kind) % 2:
        tree = yaml.safe_load(config.read_text())
        tree["register"]["serving_args"] = ["--port", "8080", f"--api-base={value}"]
        path = tmp_path / "bad.yaml"
        path.write_text(yaml.safe_dump(tree))
        result = _cli("compile", "--config", str(path), "--output", str(out))
    else:
        result = _cli("compile", "--config", str(config), "--output", str(out), f"tracking.experiment={value}")
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and result.stderr.count("\n") == 1, result.stderr
    assert secret not in result.stdout + result.stderr
    assert "not echoed" in result.stderr
    assert not out.exists()


def test_cli_dry_run_refuses_a_query_token_unechoed(tmp_path):
    value, secret = KINDS["url_query_sig"]
    result = _cli("run", "--dry-run", "--config", "qwen3_vl_4b/lora_seed", f"data.train={value}")
    assert result.returncode == 2, result.stderr
    assert secret not in result.stdout + result.stderr and "Traceback" not in result.stderr


def test_a_secret_manager_reference_compiles_as_the_reference_only(tmp_path):
    from pipelines.compile import compile_pipeline

    ref = "projects/my-proj/secrets/hf-token/versions/2"
    out = compile_pipeline(
        "configs/qwen3_vl_4b/lora_seed.yaml", str(tmp_path / "p.yaml"), overrides={"model.token_from": ref}
    )
    assert ref in out.read_text()


# --- a Secret Manager reference resolved at run time, against a local fake of the service ---------

HUB_TOKEN = "hf_SECRET_do_not_leak_123"  # tests/test_stage_model_hub.py's gated repo answers to it
ACCESS_TOKEN = "ya29.local-fake-access-token-0123456789"


class _FakeGoogle(http.server.BaseHTTPRequestHandler):
    """OAuth's token endpoint and Secret Manager v1's `versions/V:access`, as Google's REST API answers."""

    secrets: typing.ClassVar[dict[str, str]] = {}
    calls: typing.ClassVar[list[tuple[str, str, str]]] = []

    def log_message(self, *args):  # quiet
        pass

    def _reply(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.calls.append(("POST", self.path, ""))
        if self.path == "/token":
            self._reply(200, {"access_token": ACCESS_TOKEN, "expires_in": 3600, "token_type": "Bearer"})
        else:
            self._reply(404, {"error": {"code": 404}})

    def do_GET(self):  # noqa: N802
        auth = self.headers.get("Authorization", "")
        self.calls.append(("GET", self.path, auth))
        if auth != f"Bearer {ACCESS_TOKEN}":
            return self._reply(401, {"error": {"code": 401, "status": "UNAUTHENTICATED"}})
        name = self.path.removeprefix("/v1/").removesuffix(":access")
        if not self.path.endswith(":access") or name not in self.secrets:
            return self._reply(404, {"error": {"code": 404, "status": "NOT_FOUND"}})
        data = base64.b64encode(self.secrets[name].encode()).decode()
        self._reply(200, {"name": name, "payload": {"data": data}})


@pytest.fixture
def secret_manager(tmp_path, monkeypatch):
    from components.common import model_sources

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _FakeGoogle)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    creds = tmp_path / "adc.json"  # a service account key whose token endpoint (JWT bearer grant) is the fake
    creds.write_text(
        json.dumps(
            {
                "type": "service_account",
                "project_id": "p",
                "private_key_id": "fake-key-id",
                "private_key": pem.decode(),
                "client_email": "pipeline@p.iam.gserviceaccount.com",
                "client_id": "1",
                "token_uri": f"{url}/token",
            }
        )
    )
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(creds))
    monkeypatch.setattr(model_sources, "SECRET_MANAGER_URL", url)
    _FakeGoogle.secrets = {"projects/p/secrets/hf-token/versions/latest": HUB_TOKEN}
    _FakeGoogle.calls = []
    try:
        yield _FakeGoogle
    finally:
        server.shutdown()
        server.server_close()


def test_secret_manager_reference_is_read_over_http(secret_manager):
    from components.common.model_sources import SourceError, read_token

    assert read_token("projects/p/secrets/hf-token", "HF_TOKEN") == HUB_TOKEN
    assert ("GET", "/v1/projects/p/secrets/hf-token/versions/latest:access", f"Bearer {ACCESS_TOKEN}") in (
        secret_manager.calls
    )
    with pytest.raises(SourceError) as info:  # a missing secret: a named error, its value nowhere
        read_token("projects/p/secrets/other/versions/1", "HF_TOKEN")
    assert "HTTP 404" in str(info.value) and "secretAccessor" in str(info.value)


def test_stage_model_resolves_the_secret_at_run_time(secret_manager, hub_server, tmp_path, capsys, caplog):
    from components.stage_model.core import stage_model
    from components.stage_model.entry import verify_entry
    from tests.conftest import HubRepo
    from tests.test_stage_model import make_model

    files = {p.relative_to(m).as_posix(): p.read_bytes() for m in [make_model(tmp_path / "src")] for p in m.rglob("*")}
    hub_server.repos["org/gated"] = HubRepo(
        {k: v for k, v in files.items() if v is not None}, gated=True, token=HUB_TOKEN
    )
    caplog.set_level(logging.DEBUG)
    result = stage_model("hf://org/gated", str(tmp_path / "cache"), token_from="projects/p/secrets/hf-token")
    assert verify_entry(result.entry) == (True, "ok")
    auths = {r[2].get("authorization") for r in hub_server.requests if "/resolve/" in r[1]}
    assert auths == {f"Bearer {HUB_TOKEN}"}  # the hub saw the secret's value, read inside the task
    out = capsys.readouterr()
    assert HUB_TOKEN not in out.out + out.err + caplog.text
    for path in (tmp_path / "cache").rglob("*"):
        if path.is_file():
            assert HUB_TOKEN.encode() not in path.read_bytes()


def test_detector_kinds_are_each_found():
    for kind, (value, secret) in KINDS.items():
        found = secrets.find_secret(value)
        assert found and found[1] == secret, (kind, found)
    assert secrets.find_secret(HIGH_ENTROPY) is None and secrets.find_secret(HIGH_ENTROPY, free_text=True)
    assert secrets.find_in_args(["--port", "80", "--api-key", "hunter2"])[2] == "hunter2"
    assert secrets.find_in_args(["--max-tokens", "512", "--tokenizer", "qwen"]) is None
