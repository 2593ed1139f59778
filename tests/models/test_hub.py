"""Models by Hub id, resolved through a Hugging Face cache built in the test (the hub's own layout), offline.

No test reaches the network: tests/conftest.py sets HF_HUB_OFFLINE=1 before huggingface_hub loads, and `hub_cache`
points its cache at the test's own directory. What a download would do online is huggingface_hub's (its tests).
"""

from __future__ import annotations

import shutil

import httpx
import pytest
from huggingface_hub.errors import GatedRepoError, LocalEntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError

from cohort.models import hub
from cohort.models.pretrained import ModelLoadError, check_model_dir, config_dir, resolve_model_dir

REPO = "org/tiny-chat"
COMMIT_V1 = "1" * 40
COMMIT_V2 = "2" * 40


@pytest.fixture
def cached_model(place_in_hub, tiny_model_dir):
    """tiny_model_dir as the Hub's `org/tiny-chat` at two commits: `v1` (a tag) and `main` (the newer one)."""
    place_in_hub(REPO, tiny_model_dir, commit=COMMIT_V1, refs=("v1",))
    return place_in_hub(REPO, tiny_model_dir, commit=COMMIT_V2, refs=("main",))


def test_a_hub_id_resolves_to_its_snapshot_in_the_cache(cached_model, hub_cache):
    snapshot = resolve_model_dir(REPO)
    assert snapshot == hub_cache / "models--org--tiny-chat" / "snapshots" / COMMIT_V2  # refs/main names it
    assert (snapshot / "model.safetensors").is_symlink()  # the blob, as a download leaves it; read through the link
    assert check_model_dir(REPO) == [] and config_dir(REPO) == snapshot


def test_a_revision_picks_its_snapshot_by_tag_by_commit_and_after_the_at_sign(cached_model, hub_cache):
    snapshots = hub_cache / "models--org--tiny-chat" / "snapshots"
    assert resolve_model_dir(REPO, revision="v1") == snapshots / COMMIT_V1
    assert resolve_model_dir(REPO, revision=COMMIT_V1) == snapshots / COMMIT_V1
    assert resolve_model_dir(f"{REPO}@v1") == snapshots / COMMIT_V1
    with pytest.raises(ModelLoadError, match=r"the revision 'v1' after '@' and model.revision = 'main' disagree"):
        resolve_model_dir(f"{REPO}@v1", revision="main")


def test_a_missing_id_offline_is_refused_naming_the_id_and_the_fix(hub_cache):
    problems = check_model_dir("org/absent")
    assert problems == [
        f"model.path = 'org/absent': 'org/absent' is not a local directory, and Hub model org/absent is not in the Hugging "
        f"Face cache ({hub_cache}), and "
        "HF_HUB_OFFLINE=1 forbids downloading it: unset it to download it once, or fill the cache where there is a "
        "network (`hf download org/absent`) and copy it here, or give a local checkpoint directory"]
    with pytest.raises(ModelLoadError, match=r"revision 'v9' is not in the Hugging Face cache .*`hf download org/absent "
                                             r"--revision v9`"):
        resolve_model_dir("org/absent", revision="v9")


def test_the_planner_needs_no_weights_training_does(place_in_hub, tiny_model_dir, tmp_path):
    """A snapshot holding only the config and tokenizer (what `cohort plan` fetches) passes the checks; training
    refuses it, naming what is missing and how to get it."""
    meta = tmp_path / "meta"
    meta.mkdir()
    for file in tiny_model_dir.iterdir():
        if not file.name.endswith(".safetensors"):
            shutil.copy(file, meta / file.name)
    snapshot = place_in_hub(REPO, meta, commit=COMMIT_V2)
    assert check_model_dir(REPO) == [] and config_dir(REPO) == snapshot
    with pytest.raises(ModelLoadError) as error:
        resolve_model_dir(REPO)
    assert str(error.value) == (
        f"model.path = '{REPO}': Hub model {REPO} is in the Hugging Face cache ({snapshot}) with its config but without "
        f"its weights (*.safetensors), and HF_HUB_OFFLINE=1 forbids downloading it: unset it to download it once, or fill "
        f"the cache where there is a network (`hf download {REPO}`) and copy it here, or give a local checkpoint directory")


@pytest.mark.parametrize("path, hub_id", [
    ("HuggingFaceTB/SmolLM2-135M-Instruct", True), ("gpt2", True), ("org/name@v1.0", True), ("org/name@" + "a" * 40, True),
    ("./runs/final", False), ("/abs/dir", False), ("~/models/x", False), ("a/b/c", False), ("tiny:arith", False),
    ("org/na me", False), ("org/--bad", False),
])
def test_which_paths_are_hub_ids(path, hub_id):
    assert hub.looks_like_hub_id(path) is hub_id


def _http_error(cls, status: int, message: str = "refused"):
    response = httpx.Response(status, request=httpx.Request("GET", "https://huggingface.co/api/models/org/x"))
    return cls(message, response=response)


@pytest.mark.parametrize("make_error, expected", [
    (lambda: _http_error(GatedRepoError, 401), "Hub model org/x is a gated model: accept its conditions at "
     "https://huggingface.co/org/x, then log in (`hf auth login`, or set HF_TOKEN) and run again"),
    (lambda: _http_error(GatedRepoError, 403), "Hub model org/x is a gated model and your Hugging Face token has no "
     "access to it: accept its conditions at https://huggingface.co/org/x with the account of that token, then run again"),
    (lambda: _http_error(RepositoryNotFoundError, 404), "'org/x' is not a local directory, and the Hugging Face Hub has no "
     "model of that name that this login can see: check the spelling (https://huggingface.co/org/x); a private model "
     "needs `hf auth login` or HF_TOKEN"),
    (lambda: _http_error(RevisionNotFoundError, 404), "Hub model org/x: the repository has no revision None; give a branch"),
])
def test_each_hub_failure_is_one_message_with_the_fix(make_error, expected):
    assert hub.explain("org/x", None, make_error()).startswith(expected)


def test_an_unreachable_hub_online_says_so(monkeypatch):
    monkeypatch.setattr(hub.constants, "HF_HUB_OFFLINE", False)
    cause = ConnectionError("connection refused")
    error = LocalEntryNotFoundError("An error happened while trying to locate the files on the Hub")
    error.__cause__ = cause
    message = hub.explain("org/x", "v1", error)
    assert message.startswith("Hub model org/x at revision 'v1': the Hugging Face Hub could not be reached and the model "
                              "is not in the cache")
    assert message.endswith("(ConnectionError: connection refused)")
