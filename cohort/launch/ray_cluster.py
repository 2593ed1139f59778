"""`distributed.backend=ray`: the trainer worker group and the rollout servers as Ray actors.

`cohort train ... distributed.backend=ray` makes this process a Ray driver:

1. it joins the cluster at `distributed.ray_address` (`auto`, or the address
   `ray start --head` printed), or starts a local Ray just for this run;
2. when `engine.mode=server` and no `engine.server_urls` are given, it starts
   `distributed.num_rollout_servers` actors, each a vLLM engine behind the
   rollout server (`cohort.rollout.server.app`) bound to its node's address, with
   `distributed.cpus_per_rollout` / `gpus_per_rollout` each;
3. it starts `train.num_processes` trainer actors (`cpus_per_trainer` /
   `gpus_per_trainer` each), which form one torch.distributed group (rank 0's
   node address and a free port as the rendezvous), and each runs the ordinary
   `Trainer` on the driver's plan (`actor_plan`: its resolved config and batch
   plan; no actor validates again, and each reads its model's tokenizer and the
   prompts once, on its own node) — FSDP2 across them exactly as under torchrun; rank 0 writes the run
   directory on its node and drives the rollout servers (or a colocated engine);
4. it waits for all of them, stops the run as soon as one fails (the others
   would wait in a collective forever), kills the actors and returns rank 0's
   summary.

The servers' bearer token is `COHORT_SERVER_TOKEN` when set, else a fresh
random one; it travels to the actors in their environment, never in the config.
Every node must have the same Python environment, with cohort and any user
reward module importable (this driver forwards its PYTHONPATH).

A local Ray (no address) keeps every address on 127.0.0.1, declares at least
as many logical CPUs as the actors ask for (so a laptop run is never left
waiting for resources) and the GPUs that exist (`torch.cuda.device_count()`:
none on a CPU machine, so an actor asking for one is refused, not handed a GPU
that is not there), and turns usage reporting off.

GPUs: a rollout server actor sees exactly the GPUs Ray assigned it
(`actor_device_env`: CUDA_VISIBLE_DEVICES = `ray.get_gpu_ids()`). A trainer actor
sees every GPU Ray assigned to the trainer actors of its node and trains on its
own (`trainer_device_envs`: LOCAL_RANK = its GPU's place among them, so
`train.device=auto` is `cuda:LOCAL_RANK`), as Ray Train shows its workers: NCCL
finds its peers' GPUs in the same process view (with one GPU visible per process,
NCCL on NVSwitch nodes is reported to take seconds over its first collective, or
to hang: NVIDIA/nccl#1749, NVIDIA-NeMo/RL#1963). The actors report where they
landed before any of them touches CUDA; an actor without a GPU sees none.
Validation allows a trainer 0 or 1 GPU, so two NCCL ranks never share one. Actors bind their
servers to the address the cluster knows their node by.

Joining a cluster fails fast instead of waiting: before any actor is placed, the
CPUs and GPUs the actors reserve (`distributed.*_per_trainer` × train.num_processes
+ `*_per_rollout` × the server actors) are compared with `ray.cluster_resources()`
and with the largest node (an actor lives on one node); a cluster that can never
hold them is refused with both numbers and the settings that would fit. A cluster
that is big enough but busy (fewer free than needed) is only reported: Ray queues
the actors until the other work ends. A cluster with token authentication that
refuses this process's token (Ray 2.59+ `ray start --head` can turn it on) is
reported with the variables that fix it. Memory is not checked: the actors
reserve none (Ray schedules them by CPUs and GPUs only).
"""

from __future__ import annotations

import math
import os
import secrets
import socket
from pathlib import Path
from typing import Any

import torch

import cohort
from cohort.config import CohortConfig, ConfigError, default_output_dir
from cohort.models.pretrained import resolve_model_dir
from cohort.plan.run_plan import RunPlan
from cohort.rollout.server.app import TOKEN_ENV, RolloutService, serve_in_thread
from cohort.rollout.engines.vllm import VLLMEngine
from cohort.trainer.run import run_training
from cohort.trainer.trainer import Trainer

LOCAL_OBJECT_STORE_BYTES = 256 * 2**20  # the driver and actors pass configs and summaries, nothing large
USER_ENV = ("HF_HOME", "HF_HUB_CACHE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE", "HF_DATASETS_CACHE",
            "HF_TOKEN", "HF_ENDPOINT", "WANDB_MODE", "WANDB_PROJECT", "WANDB_ENTITY", "WANDB_API_KEY")  # forwarded when set


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((_node_address(), 0))
        return s.getsockname()[1]


def _node_address() -> str:
    """This actor's node address as the cluster knows it (127.0.0.1 on a local Ray), not a guess from the routes."""
    import ray  # optional dependency (pip install cohort[ray]): imported by Ray runs only

    node_id = ray.get_runtime_context().get_node_id()
    for node in ray.nodes():
        if node["NodeID"] == node_id:
            return node["NodeManagerAddress"]
    raise RuntimeError(f"this actor's node {node_id} is not in ray.nodes()")


def _enter(cwd: str) -> None:
    """Run in the driver's directory when this node has it, so relative paths in the config mean the same."""
    if os.path.isdir(cwd):
        os.chdir(cwd)


def actor_device_env(gpu_ids: list) -> dict[str, str]:
    """The environment that makes an actor use the GPUs Ray assigned it (`ray.get_gpu_ids()`) and no other: those
    visible (none when it has none, so it cannot land on a GPU another actor reserved), its device the first of them."""
    return {"CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in gpu_ids), "LOCAL_RANK": "0"}


def trainer_device_envs(placements: list[tuple[str, list]]) -> list[dict[str, str]]:
    """Each trainer actor's (node id, `ray.get_gpu_ids()`) -> its environment: CUDA_VISIBLE_DEVICES = every GPU Ray
    assigned to the trainer actors of that node (numeric order), LOCAL_RANK = the place of the actor's own GPU among
    them; an actor with no GPU sees none (LOCAL_RANK 0: it trains on the CPU)."""
    per_node: dict[str, set[str]] = {}
    for node, gpu_ids in placements:
        per_node.setdefault(node, set()).update(str(i) for i in gpu_ids)
    envs = []
    for node, gpu_ids in placements:
        visible = sorted(per_node[node], key=lambda i: (not i.isdigit(), int(i) if i.isdigit() else 0, i))
        own = visible.index(str(gpu_ids[0])) if gpu_ids else 0
        envs.append({"CUDA_VISIBLE_DEVICES": ",".join(visible) if gpu_ids else "", "LOCAL_RANK": str(own)})
    return envs


def _use_assigned_gpus() -> None:
    """Before anything in this actor touches CUDA (CUDA reads CUDA_VISIBLE_DEVICES once, when it starts)."""
    import ray  # optional dependency (pip install cohort[ray]): imported by Ray runs only

    os.environ.update(actor_device_env(ray.get_gpu_ids()))


def local_ray_resources(needed_cpus: float, cpu_count: int, gpu_count: int) -> dict[str, int]:
    """What a local Ray declares: at least the CPUs the actors ask for (logical CPUs may exceed the cores), and
    exactly the GPUs this machine has."""
    return {"num_cpus": max(cpu_count, math.ceil(needed_cpus)), "num_gpus": gpu_count}


def _actor_env(token: str, cpus: float) -> dict[str, str]:
    root = str(Path(cohort.__file__).resolve().parent.parent)
    paths = [root, os.getcwd()] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return {
        TOKEN_ENV: token,
        "PYTHONPATH": os.pathsep.join(dict.fromkeys(paths)),
        "OMP_NUM_THREADS": str(max(1, int(cpus))),
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "TOKENIZERS_PARALLELISM": "false",
        **{name: os.environ[name] for name in USER_ENV if name in os.environ},  # as the user set them, never a default
    }


class RolloutServerActor:
    """A vLLM engine behind the rollout HTTP server, on this actor's node."""

    def __init__(self, cwd: str, model_path: str, revision: str | None, dtype: str, seed: int, kv_cache_gib: float,
                 gpu_memory_utilization: float):
        _use_assigned_gpus()
        _enter(cwd)
        model_dir = resolve_model_dir(model_path, revision)
        self.engine = VLLMEngine(model_dir, dtype=dtype, max_model_len=None, seed=seed, kv_cache_gib=kv_cache_gib,
                                 gpu_memory_utilization=gpu_memory_utilization)
        limit = self.engine.llm.llm_engine.model_config.max_model_len
        service = RolloutService(self.engine, os.environ[TOKEN_ENV], model=str(model_dir), max_model_len=limit)
        self.server, self.address = serve_in_thread(service, host=_node_address(), port=0)

    def url(self) -> str:
        return self.address


class TrainerActor:
    """One rank of the trainer worker group: sets torch.distributed's environment, runs `Trainer`."""

    def __init__(self, rank: int, world_size: int):
        self.rank, self.world_size = rank, world_size  # (CUDA untouched until use_devices: see trainer_device_envs)

    def placement(self) -> tuple[str, list]:
        import ray  # optional dependency (pip install cohort[ray]): imported by Ray runs only

        return ray.get_runtime_context().get_node_id(), [str(i) for i in ray.get_gpu_ids()]

    def use_devices(self, env: dict[str, str]) -> dict[str, str]:
        """Before anything in this actor touches CUDA: the node's trainer GPUs visible, this actor's own as LOCAL_RANK."""
        os.environ.update(env)
        return {name: os.environ[name] for name in env}

    def rendezvous(self) -> tuple[str, int]:
        return _node_address(), _free_port()

    def train(self, cwd: str, plan: RunPlan, master: tuple[str, int]) -> dict[str, Any]:
        """Train this rank on the driver's validated `plan` (`actor_plan`); the Trainer does not validate it again."""
        _enter(cwd)
        if self.world_size > 1:
            os.environ.update({"MASTER_ADDR": master[0], "MASTER_PORT": str(master[1]), "RANK": str(self.rank),
                               "WORLD_SIZE": str(self.world_size)})  # (LOCAL_RANK: set by use_devices)
        trainer = Trainer(plan)
        try:
            return run_training(trainer)
        finally:
            trainer.close()


def place_trainers(trainers: list) -> list[dict[str, str]]:
    """Ask each trainer actor where Ray put it, then show it its node's trainer GPUs (trainer_device_envs)."""
    envs = trainer_device_envs(_wait_all([t.placement.remote() for t in trainers]))
    return _wait_all([t.use_devices.remote(env) for t, env in zip(trainers, envs)])


AUTH_FAILURE = "Authentication token is missing or incorrect"  # what Ray's GCS answers a driver without the token


def _connect(cfg, needed_cpus: float) -> None:
    """Join the cluster at distributed.ray_address, or start a local Ray for this run."""
    import ray  # optional dependency (pip install cohort[ray]): imported by Ray runs only

    address = cfg.distributed.ray_address
    if address:
        try:
            ray.init(address=address, log_to_driver=True)
        except ConnectionError as exc:
            raise ConfigError([_connection_problem(address, exc)]) from exc
        return
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    ray.init(**local_ray_resources(needed_cpus, os.cpu_count() or 1, gpus), include_dashboard=False,
             object_store_memory=LOCAL_OBJECT_STORE_BYTES, log_to_driver=True)


def _connection_problem(address: str, exc: BaseException) -> str:
    """Why `ray.init(address=...)` failed, and the fix; Ray wraps the authentication error in its traceback text."""
    chain, cause = [], exc
    while cause is not None and len(chain) < 10:
        chain.append(f"{type(cause).__name__}: {cause}")
        cause = cause.__cause__ or cause.__context__
    if any(AUTH_FAILURE in text or "AuthenticationError" in text for text in chain):
        return (f"distributed.ray_address = {address}: the Ray cluster refused this process ('{AUTH_FAILURE}'): it runs "
                "with token authentication (Ray 2.59+ `ray start --head` may turn it on). Set RAY_AUTH_MODE=token in the "
                "environment of `cohort train`, with the cluster's token in RAY_AUTH_TOKEN or in ~/.ray/auth_token "
                "(`ray get-auth-token` on the head node prints it)")
    return (f"distributed.ray_address = {address}: no Ray cluster answered there ({exc}); give the address `ray start "
            "--head` printed (HOST:PORT), or `auto` on a node of the cluster, or unset it to start a local Ray for this run")


def _fitting(share: float) -> float:
    """The largest setting Ray accepts at or below `share`: a whole number from 1 up, hundredths below 1."""
    return float(math.floor(share)) if share >= 1 else math.floor(share * 100) / 100


def cluster_problems(cfg, total: dict[str, float], nodes: list[dict[str, float]], address: str) -> list[str]:
    """What the actors reserve that the cluster (`total`, and `nodes`, one resource dict per live node) cannot hold."""
    d, world, servers = cfg.distributed, cfg.train.num_processes, _servers_to_start(cfg)
    problems = []
    for resource, key, per_trainer, per_rollout in (("CPU", "cpus", d.cpus_per_trainer, d.cpus_per_rollout),
                                                    ("GPU", "gpus", d.gpus_per_trainer, d.gpus_per_rollout)):
        need, have = world * per_trainer + servers * per_rollout, float(total.get(resource, 0.0))
        if need > have + 1e-9:
            parts = f"{world} trainer actor(s) × {per_trainer:g}" + (f" + {servers} rollout server actor(s) × {per_rollout:g}"
                                                                     if servers else "")
            problems.append(f"the run needs {need:g} {resource}s ({parts}), the Ray cluster at {address} has {have:g}: "
                            f"{_resource_fix(key, have, world, servers, per_rollout)}")
            continue
        largest = max((float(n.get(resource, 0.0)) for n in nodes), default=0.0)
        for label, count, per in (("trainer", world, per_trainer), ("rollout", servers, per_rollout)):
            if count and per > largest + 1e-9:
                problems.append(f"distributed.{key}_per_{label} = {per:g}: an actor runs on one node and the largest node of "
                                f"the Ray cluster at {address} has {largest:g} {resource}s; set distributed.{key}_per_{label}="
                                f"{_fitting(largest):g} or less, or add a larger node")
    return problems


def _resource_fix(key: str, have: float, world: int, servers: int, per_rollout: float) -> str:
    more = "add nodes to the cluster, or lower train.num_processes"
    if have <= 0:
        return f"set distributed.{key}_per_trainer=0 and distributed.{key}_per_rollout=0, or {more}"
    left = have - servers * per_rollout  # keep the rollout servers' share, split the rest between the trainers
    if left > 0 and _fitting(left / world) > 0:
        return f"set distributed.{key}_per_trainer={_fitting(left / world):g}, or {more}"
    share = _fitting(have / (world + servers))
    return f"set distributed.{key}_per_trainer={share:g} and distributed.{key}_per_rollout={share:g}, or {more}"


def _servers_to_start(cfg) -> int:
    spawn = cfg.engine.mode == "server" and not cfg.engine.server_urls
    return cfg.distributed.num_rollout_servers if spawn else 0


def _check_cluster(cfg) -> None:
    """Refuse a cluster that can never hold the actors; say so when it is busy (the actors then wait)."""
    import ray  # optional dependency (pip install cohort[ray]): imported by Ray runs only

    address = cfg.distributed.ray_address or "local"
    nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
    problems = cluster_problems(cfg, ray.cluster_resources(), nodes, address)
    if problems:
        raise ConfigError(problems)
    busy = cluster_problems(cfg, ray.available_resources(), nodes, address)
    if busy:
        print(f"cohort: the Ray cluster is busy, so the actors wait until its other work frees: {busy[0]}", flush=True)


def _wait_all(futures: list) -> list:
    """Results of every future; the first failure is raised at once (its peers may be stuck in a collective)."""
    import ray  # optional dependency (pip install cohort[ray]): imported by Ray runs only

    pending, by_ref = list(futures), {}
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        by_ref[done[0]] = ray.get(done[0])
    return [by_ref[f] for f in futures]


def actor_plan(plan: RunPlan, server_urls: list[str]) -> RunPlan:
    """What each trainer actor trains: the driver's plan with its config as the actors run it (they train, and launch
    no further actors; the rollout servers at `server_urls`; the run directory absolute), without what this process
    read (a tokenizer and the encoded prompts stay here: each actor reads its own once, on its node)."""
    cfg = plan.config
    tree = cfg.to_dict()
    tree["distributed"]["backend"] = "none"
    tree["engine"]["server_urls"] = list(server_urls)
    tree["run"]["output_dir"] = os.path.abspath(cfg.run.output_dir or default_output_dir())
    return plan.for_another_process(CohortConfig.model_validate(tree))


def train_with_ray(plan: RunPlan) -> dict[str, Any]:
    """Run the validated training `plan` on Ray actors; returns rank 0's summary."""
    cfg = plan.config
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if not cfg.distributed.ray_address:
        # Ray reads this at import: with it off, a local Ray keeps every address on 127.0.0.1 (by default it
        # advertises the machine's routed address even for a single-node run).
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    import ray  # optional dependency (pip install cohort[ray]): imported by Ray runs only

    d, world, servers_n = cfg.distributed, cfg.train.num_processes, _servers_to_start(cfg)
    _connect(cfg, world * d.cpus_per_trainer + servers_n * d.cpus_per_rollout)
    token = os.environ.get(TOKEN_ENV) or secrets.token_hex(16)
    actors: list = []
    try:
        _check_cluster(cfg)
        urls = list(cfg.engine.server_urls)
        if servers_n:
            remote = ray.remote(RolloutServerActor).options(
                num_cpus=d.cpus_per_rollout, num_gpus=d.gpus_per_rollout,
                runtime_env={"env_vars": _actor_env(token, d.cpus_per_rollout)})
            servers = [remote.remote(os.getcwd(), cfg.model.path, cfg.model.revision, cfg.generation_dtype, cfg.rollout.seed + i, cfg.engine.kv_cache_gib,
                                     cfg.engine.gpu_memory_utilization) for i in range(servers_n)]
            actors += servers
            urls = _wait_all([s.url.remote() for s in servers])
            print(f"cohort: {servers_n} rollout server actor(s) at {', '.join(urls)}", flush=True)
        trained = actor_plan(plan, urls)
        remote = ray.remote(TrainerActor).options(num_cpus=d.cpus_per_trainer, num_gpus=d.gpus_per_trainer,
                                                  runtime_env={"env_vars": _actor_env(token, d.cpus_per_trainer)})
        trainers = [remote.remote(rank, world) for rank in range(world)]
        actors += trainers
        place_trainers(trainers)
        master = ray.get(trainers[0].rendezvous.remote())
        print(f"cohort: {world} trainer actor(s); run directory {trained.config.run.output_dir} on rank 0's node", flush=True)
        return _wait_all([t.train.remote(os.getcwd(), trained, master) for t in trainers])[0]
    finally:
        for actor in actors:
            ray.kill(actor)
        ray.shutdown()  # stops a local Ray; leaves a joined cluster running, this driver disconnected

