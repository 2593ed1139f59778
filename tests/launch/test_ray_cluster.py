"""Joining a Ray cluster (docs/deployment.md, "Several machines") fails fast and says how to fix it.

Pure checks first (hand-computed resource sums), then the recipe against a real
`ray start --head` on this machine: loopback only (node address 127.0.0.1, no
dashboard), token authentication on, as Ray 2.59+ heads may have it. The head runs
with `--block` and is stopped by signalling that process, which stops exactly the
processes it started (`ray stop` would also stop other Ray sessions of this user).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from cohort.config.resolve import load_config
from cohort.launch.ray_cluster import (AUTH_FAILURE, _actor_env, _connection_problem, actor_device_env, cluster_problems,
                                       local_ray_resources, trainer_device_envs)
from tests.builders import write_doubling

TOKEN = "cohort-test-token-0123456789abcdef"


def _cfg(*overrides):
    return load_config(None, ["distributed.backend=ray", "engine.mode=server", "train.num_processes=2", *overrides])


def test_a_cluster_with_too_few_cpus_is_refused_with_both_numbers_and_a_fit():
    # 2 trainers × 1 CPU + 1 rollout server × 1 CPU = 3 > 2; keeping the server's 1, the trainers share (2 − 1) / 2 = 0.5
    problems = cluster_problems(_cfg(), {"CPU": 2.0}, [{"CPU": 2.0}], "127.0.0.1:6379")
    assert problems == ["the run needs 3 CPUs (2 trainer actor(s) × 1 + 1 rollout server actor(s) × 1), the Ray cluster at "
                        "127.0.0.1:6379 has 2: set distributed.cpus_per_trainer=0.5, or add nodes to the cluster, or lower "
                        "train.num_processes"]
    assert cluster_problems(_cfg("distributed.cpus_per_trainer=0.5"), {"CPU": 2.0}, [{"CPU": 2.0}], "a") == []  # 0.5×2+1 = 2


def test_the_rollout_share_is_cut_too_when_it_alone_fills_the_cluster():
    # 2 × 1 + 1 × 2 = 4 > 2; the server's 2 leave nothing, so all three actors share 2 / 3 = 0.666 → 0.66
    problems = cluster_problems(_cfg("distributed.cpus_per_rollout=2"), {"CPU": 2.0}, [{"CPU": 2.0}], "h:1")
    assert problems[0].endswith("set distributed.cpus_per_trainer=0.66 and distributed.cpus_per_rollout=0.66, or add nodes "
                                "to the cluster, or lower train.num_processes")


def test_an_actor_sees_only_the_gpus_ray_assigned_it():
    # GPU 3 of the node: visible as the actor's cuda:0, which train.device=auto (cuda:LOCAL_RANK) picks
    assert actor_device_env([3]) == {"CUDA_VISIBLE_DEVICES": "3", "LOCAL_RANK": "0"}
    assert actor_device_env([0, 5]) == {"CUDA_VISIBLE_DEVICES": "0,5", "LOCAL_RANK": "0"}  # a rollout server's 2 GPUs
    assert actor_device_env([]) == {"CUDA_VISIBLE_DEVICES": "", "LOCAL_RANK": "0"}  # none reserved: none visible (CPU)


def test_a_trainer_actor_sees_its_nodes_trainer_gpus_and_trains_on_its_own():
    # Node A holds trainer actors on GPUs 2, 0 and 1 (in rank order), node B one on GPU 1. Each actor sees its node's
    # trainer GPUs in numeric order, A: "0,1,2" (so NCCL finds its peers' GPUs in the same view, as under Ray Train), and
    # trains on its own: GPU 2 is the third visible (LOCAL_RANK 2 -> cuda:2), GPU 0 the first, GPU 1 the second; B's
    # only GPU is its cuda:0. GPU 10 sorts after 9 (numeric, not text, order).
    placements = [("A", ["2"]), ("A", ["0"]), ("B", ["1"]), ("A", [1]), ("C", ["10"]), ("C", ["9"])]
    assert trainer_device_envs(placements) == [
        {"CUDA_VISIBLE_DEVICES": "0,1,2", "LOCAL_RANK": "2"}, {"CUDA_VISIBLE_DEVICES": "0,1,2", "LOCAL_RANK": "0"},
        {"CUDA_VISIBLE_DEVICES": "1", "LOCAL_RANK": "0"}, {"CUDA_VISIBLE_DEVICES": "0,1,2", "LOCAL_RANK": "1"},
        {"CUDA_VISIBLE_DEVICES": "9,10", "LOCAL_RANK": "1"}, {"CUDA_VISIBLE_DEVICES": "9,10", "LOCAL_RANK": "0"}]
    # trainers without GPUs (a CPU run) see none, each on the CPU
    assert trainer_device_envs([("A", []), ("A", [])]) == [{"CUDA_VISIBLE_DEVICES": "", "LOCAL_RANK": "0"}] * 2


@pytest.mark.slow
def test_trainer_actors_on_a_ray_with_two_declared_gpus_see_both(tmp_path):
    """A real local Ray that declares 2 GPUs (Ray assigns ids; no CUDA is touched): the two trainer actors, one GPU each,
    report where they landed and are shown both GPUs, each its own as LOCAL_RANK (before the fix each saw only its own)."""
    ray = pytest.importorskip("ray")
    from cohort.launch.ray_cluster import LOCAL_OBJECT_STORE_BYTES, TrainerActor, place_trainers

    ray.init(num_cpus=2, num_gpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False,
             object_store_memory=LOCAL_OBJECT_STORE_BYTES)
    try:
        remote = ray.remote(TrainerActor).options(num_cpus=0.5, num_gpus=1)
        trainers = [remote.remote(rank, 2) for rank in range(2)]
        envs = place_trainers(trainers)
        own = [ray.get(t.placement.remote())[1] for t in trainers]
    finally:
        ray.shutdown()
    assert sorted(own) == [["0"], ["1"]]  # Ray gave each actor one of the two GPUs
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["0,1", "0,1"]
    assert [e["LOCAL_RANK"] for e in envs] == [own[0][0], own[1][0]]  # GPU k is the k-th visible


def test_a_local_ray_declares_the_gpus_that_exist():
    # actors ask for 2 × 1.5 + 1 = 4 CPUs on a 2-core machine: 4 logical CPUs; GPUs: exactly what torch sees
    assert local_ray_resources(4.0, 2, 0) == {"num_cpus": 4, "num_gpus": 0}
    assert local_ray_resources(3.5, 16, 8) == {"num_cpus": 16, "num_gpus": 8}
    assert local_ray_resources(16.25, 16, 2) == {"num_cpus": 17, "num_gpus": 2}  # a fraction rounds up


def test_gpus_and_node_sizes_are_checked():
    # no GPU anywhere: 2 × 1 GPU asked for
    problems = cluster_problems(_cfg("engine.mode=colocate", "distributed.gpus_per_trainer=1"), {"CPU": 8.0}, [{"CPU": 8.0}], "h:1")
    assert problems == ["the run needs 2 GPUs (2 trainer actor(s) × 1), the Ray cluster at h:1 has 0: set "
                        "distributed.gpus_per_trainer=0 and distributed.gpus_per_rollout=0, or add nodes to the cluster, or "
                        "lower train.num_processes"]
    # 8 CPUs in total fit 2 × 3 + 1, but no single node holds a 3-CPU trainer
    problems = cluster_problems(_cfg("distributed.cpus_per_trainer=3"), {"CPU": 8.0}, [{"CPU": 2.0}] * 4, "h:1")
    assert problems == ["distributed.cpus_per_trainer = 3: an actor runs on one node and the largest node of the Ray cluster "
                        "at h:1 has 2 CPUs; set distributed.cpus_per_trainer=2 or less, or add a larger node"]


def test_an_authentication_failure_names_the_setting():
    inner = RuntimeError(f"Failed to connect to GCS. Last connection error: ... AuthenticationError: RPC error: {AUTH_FAILURE}")
    outer = ConnectionError("Failed to connect to Ray cluster at 127.0.0.1:6379")
    outer.__cause__ = inner
    assert "RAY_AUTH_MODE=token" in _connection_problem("127.0.0.1:6379", outer)
    assert "no Ray cluster answered there" in _connection_problem("127.0.0.1:6379", ConnectionError("refused"))


# --------------------------------------------------------------------------- a real `ray start --head` on loopback


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ray_head():
    pytest.importorskip("ray")
    ray_bin = Path(sys.executable).with_name("ray")
    port, temp_dir = _free_port(), tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's socket paths have a length limit
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "token",
           "RAY_AUTH_TOKEN": TOKEN}
    log = open(Path(temp_dir) / "head.log", "w")
    head = subprocess.Popen([str(ray_bin), "start", "--head", "--block", "--node-ip-address=127.0.0.1", f"--port={port}",
                             "--num-cpus=2", "--num-gpus=0", "--include-dashboard=false", "--disable-usage-stats",
                             f"--temp-dir={temp_dir}"], env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 120
        while "Ray runtime started" not in (Path(temp_dir) / "head.log").read_text():
            assert head.poll() is None and time.time() < deadline, (Path(temp_dir) / "head.log").read_text()[-3000:]
            time.sleep(1)
        yield f"127.0.0.1:{port}"
    finally:
        head.send_signal(signal.SIGTERM)  # `ray start --block` drains and stops the processes it started
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            head.kill()
        log.close()


def _train(tmp_path, tiny_model_dir, address, *extra, auth=True, timeout_s=120):
    data = tmp_path / "train.jsonl"
    write_doubling(data, 16, answers=False)
    (tmp_path / "cluster_rewards.py").write_text("def sevens(prompts, completions, **kw):\n    return [c.count('7') / max(1, len(c)) for c in completions]\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    # RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 on both sides keeps Ray on 127.0.0.1 (else the driver swaps it for the routed address)
    env.update(PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]), RAY_USAGE_STATS_ENABLED="0",
               OMP_NUM_THREADS="1", RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    if auth:
        env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=TOKEN)
    args = [f"model.path={tiny_model_dir}", f"data.train_files=[{data}]", "data.max_prompt_length=16", "rollout.num_generations=4",
            "rollout.max_completion_length=6", "train.prompts_per_step=4", "train.micro_batch_size=4", "train.learning_rate=3e-3",
            "rewards=[{name: cluster_rewards.sevens}]", "run.progress=false", "run.loggers=[jsonl]", "run.log_completions_every=0",
            "distributed.backend=ray", f"distributed.ray_address={address}", "train.num_processes=2",
            f"run.output_dir={tmp_path / 'run'}", *extra]
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "cohort.cli", "train", *args], env=env, capture_output=True, text=True, timeout=timeout_s)
    return proc, time.perf_counter() - start


@pytest.mark.slow
def test_the_recipe_on_a_real_head_refuses_fast_then_trains(tmp_path, tiny_model_dir, ray_head):
    # without the cluster's token: refused, naming the setting (Ray retries the connection for about 20 s first)
    proc, _ = _train(tmp_path, tiny_model_dir, ray_head, "engine.mode=server", auth=False)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "RAY_AUTH_MODE=token" in proc.stderr and AUTH_FAILURE in proc.stderr
    # the docs' recipe on a 2-CPU head: 2 trainers × 1 + 1 rollout server × 1 = 3 CPUs; refused before any actor starts
    proc, seconds = _train(tmp_path, tiny_model_dir, ray_head, "engine.mode=server")
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert f"the run needs 3 CPUs (2 trainer actor(s) × 1 + 1 rollout server actor(s) × 1), the Ray cluster at {ray_head} has 2: " \
           "set distributed.cpus_per_trainer=0.5" in proc.stderr
    assert "rollout server actor(s) at" not in proc.stdout and seconds < 60, seconds  # measured: 13 s, mostly imports and connecting
    # what fits: two 1-CPU trainer actors, rank 0 generating with transformers; three steps on the joined cluster
    proc, _ = _train(tmp_path, tiny_model_dir, ray_head, "engine.mode=colocate", "engine.name=hf", "train.max_steps=3",
                      timeout_s=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [1, 2, 3]
    assert (tmp_path / "run" / "ranks" / "rank-1" / "metrics.jsonl").is_file()  # the second actor trained beside rank 0


def test_actors_get_the_users_hub_and_wandb_variables_only_as_set(monkeypatch):
    """Forwarded when the user set them (a joined cluster's nodes have their own environment), never given a default."""
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HOME", "HF_TOKEN", "WANDB_MODE"):
        monkeypatch.delenv(name, raising=False)
    env = _actor_env("token", 2)
    assert not {"HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HOME", "HF_TOKEN", "WANDB_MODE"} & set(env)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setenv("HF_HOME", "/data/hf")
    env = _actor_env("token", 2)
    assert (env["HF_HUB_OFFLINE"], env["HF_HOME"]) == ("0", "/data/hf")
