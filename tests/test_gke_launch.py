"""One launcher contract (issue 55): train-lora's launch plan reads a JobSet pod's environment (JOB_COMPLETION_INDEX,
the chief's host `<jobset>-<rjob>-0-0.<service>`) beside Vertex's CLUSTER_SPEC; pure functions, and the pods of a
built manifest."""

from __future__ import annotations

import json

import pytest

from components.common import cluster
from components.common import jobset as js
from components.train_lora.job_env import JobEnvError, check_job_env
from pipelines.config import load_config

TWO_NODE = "configs/qwen3_vl_4b/lora_h100_x8_2node.yaml"


def pod_env(manifest: dict, index: int) -> dict[str, str]:
    """The environment Kubernetes gives pod `index` of the manifest: its env, the JobSet labels resolved."""
    pod = manifest["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    labels = {
        "jobset.sigs.k8s.io/jobset-name": manifest["metadata"]["name"],
        "jobset.sigs.k8s.io/replicatedjob-name": manifest["spec"]["replicatedJobs"][0]["name"],
    }
    env = {"JOB_COMPLETION_INDEX": str(index)}
    for var in pod["containers"][0]["env"]:
        if "value" in var:
            env[var["name"]] = var["value"]
        else:
            path = var["valueFrom"]["fieldRef"]["fieldPath"]
            env[var["name"]] = labels[path.split("'")[1]]
    return env


def test_each_pod_of_the_jobset_gets_its_rank_and_the_chiefs_host(tmp_path):
    from pipelines.gke import jobset_spec

    cfg = load_config(TWO_NODE)
    manifest = js.build_jobset(jobset_spec(cfg, "img", "run-1", ["python3"], []))
    plans = [cluster.launch_plan(pod_env(manifest, i), 8) for i in range(2)]
    assert [p.node_rank for p in plans] == [0, 1] and [p.is_chief for p in plans] == [True, False]
    for p in plans:
        # JobSet's pod host: <jobset>-<replicated job>-<job index>-<pod index>.<subdomain>
        assert (p.nnodes, p.master_addr, p.master_port) == (2, "run-1-node-0-0.run-1", 29500)
        assert p.env["NNODES"] == "2" and p.env["NPROC_PER_NODE"] == "8" and p.world_size == 16


def test_the_chief_host_follows_another_subdomain():
    env = {"JOB_COMPLETION_INDEX": "0", "JOBSET_NAME": "a", "REPLICATED_JOB_NAME": "w", "JOBSET_NNODES": "3",
           "JOBSET_MASTER_PORT": "1234", "JOBSET_SUBDOMAIN": "svc"}  # fmt: skip
    assert cluster.launch_plan(env, 0).master_addr == "a-w-0-0.svc"
    assert cluster.parse_jobset_env(env)[2] == ["a-w-0-0.svc", "a-w-0-1.svc", "a-w-0-2.svc"]


def test_a_single_pod_jobset_is_a_single_node():
    env = {"JOB_COMPLETION_INDEX": "0", "JOBSET_NAME": "a", "REPLICATED_JOB_NAME": "node", "JOBSET_NNODES": "1",
           "JOBSET_MASTER_PORT": "29500"}  # fmt: skip
    plan = cluster.launch_plan(env, 1)
    assert (plan.nnodes, plan.env) == (1, {})


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"JOB_COMPLETION_INDEX": "2"}, "JOB_COMPLETION_INDEX is 2 but JOBSET_NNODES is 2"),
        ({"JOBSET_NNODES": "two"}, "JOBSET_NNODES is 'two'"),
        ({"REPLICATED_JOB_NAME": ""}, "REPLICATED_JOB_NAME is not set"),
        ({"CLUSTER_SPEC": json.dumps({"cluster": {"workerpool0": ["h:1"]}, "task": {"type": "workerpool0"}})},
         "both CLUSTER_SPEC"),
    ],
)  # fmt: skip
def test_a_broken_jobset_environment_is_a_named_error(change, match):
    env = {"JOB_COMPLETION_INDEX": "1", "JOBSET_NAME": "a", "REPLICATED_JOB_NAME": "node", "JOBSET_NNODES": "2",
           "JOBSET_MASTER_PORT": "29500", **change}  # fmt: skip
    with pytest.raises(cluster.JobSetEnvError, match=match):
        cluster.launch_plan(env, 1)


def test_vertex_cluster_spec_still_reads_as_before():
    spec = {"cluster": {"workerpool0": ["chief:2222"], "workerpool1": ["w:2222"]}, "task": {"type": "workerpool1"}}
    plan = cluster.launch_plan({"CLUSTER_SPEC": json.dumps(spec)}, 2)
    assert (plan.nnodes, plan.node_rank, plan.master_addr, plan.master_port) == (2, 1, "chief", 2222)


@pytest.mark.parametrize("name", ["JOB_COMPLETION_INDEX", "JOBSET_NNODES", "JOBSET_NAME"])
def test_the_jobset_variables_are_reserved_in_the_config_environment(name):
    with pytest.raises(JobEnvError, match="reserved"):
        check_job_env({name: "1"}, "environment")


@pytest.mark.parametrize(
    ("flag", "value", "words"),
    [
        ("--swift-args", "{lora_rank: 8", "--swift-args is not JSON"),
        ("--job-env", "[1]", "--job-env must be a JSON object"),
    ],
)
def test_the_pods_command_refuses_bad_json_in_one_line(tmp_path, capsys, flag, value, words):
    from components.train_lora.__main__ import main

    args = ["--model", str(tmp_path), "--train", str(tmp_path), "--adapter", str(tmp_path / "a"), flag, value]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"train-lora: {words}") and "\n" not in err and "Traceback" not in err
    assert not (tmp_path / "a").exists()


def test_the_pods_command_names_a_model_folder_without_config_json(tmp_path, capsys):
    from components.train_lora.__main__ import main

    args = [
        "--model",
        str(tmp_path / "m"),
        "--train",
        str(tmp_path),
        "--adapter",
        str(tmp_path / "a"),
        "--preflight",
        "off",
    ]
    assert main(args) == 1
    assert "base model folder has no config.json; stage the model first" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["0", "-1", "soon", "inf", "nan"])
def test_the_pods_command_refuses_a_checkpoint_interval_that_is_not_positive_seconds(tmp_path, capsys, value):
    from components.train_lora.__main__ import main

    args = ["--model", str(tmp_path), "--train", str(tmp_path), "--adapter", str(tmp_path / "a"),
            "--checkpoint-interval-s", value]  # fmt: skip
    with pytest.raises(SystemExit) as exit_:
        main(args)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"--checkpoint-interval-s: expected a positive number of seconds, got {value!r}" in err
    assert "Traceback" not in err and not (tmp_path / "a").exists()
