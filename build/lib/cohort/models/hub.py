"""Models by their Hugging Face Hub names: `org/name` (or `org/name@revision`) -> a snapshot directory in the HF cache.

`hub_snapshot(repo_id, revision, weights=True)` is `huggingface_hub.snapshot_download` restricted to the files a
causal LM checkpoint needs, at the top level of the repository: the config, generation config, tokenizer files and
chat template, and the weights (the `.safetensors` files, or the `.bin` files of a repository without any). ONNX,
GGUF, TF and Flax copies and anything in a subfolder stay on the Hub. `weights=False` (the planner, `cohort plan`,
the reward model's cheap check) fetches the config and tokenizer files only.

Everything else is huggingface_hub's, as the user set it up: the cache (HF_HOME / HF_HUB_CACHE), offline mode
(HF_HUB_OFFLINE), the token (HF_TOKEN or `hf auth login`), progress bars, and its file locks (processes on one node
that ask for the same file wait for each other, so it is downloaded once). Nothing here sets an environment variable.
A file already in the cache is never downloaded again; with HF_HUB_OFFLINE=1 the cache is all there is.

Each failure becomes one `HubModelError` naming the id and what to do: a gated model (401/403), a model that does
not exist or is private, a revision that does not exist, an offline cache miss, a snapshot with its config but not
its weights.

Left out: repositories whose modelling code lives in the repository (`*.py` is not fetched; trust_remote_code is
never passed), and `.gguf` files inside a repository (cohort/models/gguf.py reads local ones).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from huggingface_hub import constants, get_cached_repo_tree, get_safetensors_metadata, snapshot_download
from huggingface_hub.errors import (CachedRepoTreeNotFoundError, GatedRepoError, HfHubHTTPError, HFValidationError,
                                    LocalEntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError)
from huggingface_hub.utils import validate_repo_id

CONFIG_FILES = ["*.json", "*.txt", "*.model", "*.jinja", "*.tiktoken"]  # config, tokenizer, chat template, weight index
TOP_LEVEL_ONLY = ["*/*"]  # (fnmatch's * crosses '/': this leaves out every file in a subfolder)
WEIGHT_SUFFIXES = (".safetensors", ".bin")  # the safetensors files when the repository has any, else PyTorch's .bin
REVISION_MARK = "@"
_ID = re.compile(r"^[\w.\-]+(/[\w.\-]+)?$", re.ASCII)
_RESOLVED: dict[tuple, Path] = {}  # (cache, id, revision, weights) -> snapshot, once per process (validation, then loading, look it up)


class HubModelError(ValueError):
    """A Hub id that cannot be resolved; the message names the id and the fix (the caller prefixes the field)."""


def split_revision(path: str, revision: str | None = None) -> tuple[str, str | None]:
    """(`org/name`, revision) from `org/name@revision` or from the separate `revision`; both given must agree."""
    repo_id, mark, in_path = path.partition(REVISION_MARK)
    if not mark:
        return path, revision
    if revision is not None and revision != in_path:
        raise HubModelError(f"the revision {in_path!r} after '@' and model.revision = {revision!r} disagree; give one")
    return repo_id, in_path


def looks_like_hub_id(path: str) -> bool:
    """`name`, `org/name` or either with `@revision`, and not written as a filesystem path (`./x`, `/x`, `~/x`)."""
    repo_id, _ = path.partition(REVISION_MARK)[::2]
    if path.startswith((".", "/", "~")) or not _ID.match(repo_id):
        return False
    try:
        validate_repo_id(repo_id)
    except HFValidationError:
        return False
    return True


def hub_snapshot(path: str, revision: str | None = None, *, weights: bool = True) -> Path:
    """The snapshot directory of Hub model `path` (`org/name`, or `org/name@revision`) at `revision` (None: the default
    branch), with its config and tokenizer files and, with `weights`, its weights; downloaded into the HF cache first
    when they are not there (and the network is allowed). Raises HubModelError."""
    repo_id, revision = split_revision(path, revision)
    key = (constants.HF_HUB_CACHE, repo_id, revision, weights)
    if key in _RESOLVED and _RESOLVED[key].is_dir():
        return _RESOLVED[key]
    try:
        folder = Path(snapshot_download(repo_id, revision=revision, allow_patterns=CONFIG_FILES,
                                        ignore_patterns=TOP_LEVEL_ONLY))
        if weights:  # by commit hash: no second look-up of the revision, and the same commit as the config
            folder = Path(snapshot_download(repo_id, revision=folder.name, allow_patterns=_weight_patterns(repo_id, folder),
                                            ignore_patterns=TOP_LEVEL_ONLY))
    except Exception as exc:
        raise HubModelError(explain(repo_id, revision, exc)) from exc
    _check_snapshot(repo_id, revision, folder, weights)
    _RESOLVED[key] = folder
    return folder


def hub_parameter_count(path: str, revision: str | None = None) -> int | None:
    """The parameters in a Hub model's safetensors files, read from the headers on the Hub (a few KiB per file by
    range request, never the weights); None offline, for a local directory or anything else that is no Hub id, or when
    the Hub cannot tell."""
    if constants.HF_HUB_OFFLINE or not looks_like_hub_id(path) or Path(path).expanduser().is_dir():
        return None
    try:
        repo_id, revision = split_revision(path, revision)
        return sum(get_safetensors_metadata(repo_id, revision=revision).parameter_count.values()) or None
    except Exception:  # no safetensors, unreachable, gated: the planner only says it could not estimate
        return None


def _weight_patterns(repo_id: str, folder: Path) -> list[str]:
    """`*.safetensors` when the repository (its cached file list, else the snapshot on disk) has any, else `*.bin`."""
    try:
        names = [f.path for f in get_cached_repo_tree(repo_id, revision=folder.name) if "/" not in f.path]
    except CachedRepoTreeNotFoundError:  # a cache copied by hand, or filled by an older huggingface_hub
        names = [p.name for p in folder.iterdir()]
    for suffix in WEIGHT_SUFFIXES:
        if any(name.endswith(suffix) for name in names):
            return [f"*{suffix}"]
    return [f"*{WEIGHT_SUFFIXES[0]}"]


def _check_snapshot(repo_id: str, revision: str | None, folder: Path, weights: bool) -> None:
    if not (folder / "config.json").is_file():
        raise HubModelError(f"the Hub repository {repo_id} (snapshot {folder}) has no config.json at its top level, so it "
                            "is not a transformers checkpoint; give a repository that from_pretrained loads")
    if weights and not any(p.name.endswith(WEIGHT_SUFFIXES) for p in folder.iterdir()):
        raise HubModelError(f"{_named(repo_id, revision)} is in the Hugging Face cache ({folder}) with its config but without "
                            f"its weights (*.safetensors){_offline_fix(repo_id, revision)}")


def explain(repo_id: str, revision: str | None, exc: BaseException) -> str:
    """One message for a failed snapshot_download: what happened to which id, and what to do."""
    named, page = _named(repo_id, revision), f"https://huggingface.co/{repo_id}"
    status = getattr(getattr(exc, "response", None), "status_code", None)
    if isinstance(exc, GatedRepoError):
        if status == 403:
            return (f"{named} is a gated model and your Hugging Face token has no access to it: accept its conditions at "
                    f"{page} with the account of that token, then run again")
        return (f"{named} is a gated model: accept its conditions at {page}, then log in (`hf auth login`, or set HF_TOKEN) "
                "and run again")
    if isinstance(exc, RevisionNotFoundError):
        return (f"{named}: the repository has no revision {revision!r}; give a branch, tag or commit hash it has "
                f"({page}/tree/main lists them), or unset the revision for the default branch")
    if isinstance(exc, RepositoryNotFoundError) or status == 401:
        return (f"{repo_id!r} is not a local directory, and the Hugging Face Hub has no model of that name that this "
                f"login can see: check the spelling ({page}); a private model needs `hf auth login` or HF_TOKEN")
    if isinstance(exc, HFValidationError):
        return f"{repo_id!r} is neither a local directory nor a valid Hub id (org/name): {exc}"
    if isinstance(exc, LocalEntryNotFoundError):
        if constants.HF_HUB_OFFLINE:
            return (f"{repo_id!r} is not a local directory, and {named} is not in the Hugging Face cache "
                    f"({constants.HF_HUB_CACHE}){_offline_fix(repo_id, revision)}")
        return (f"{named}: the Hugging Face Hub could not be reached and the model is not in the cache "
                f"({constants.HF_HUB_CACHE}): check the network (or HF_ENDPOINT), or give a local checkpoint directory "
                f"({type(exc.__cause__ or exc).__name__}: {str(exc.__cause__ or exc).splitlines()[0]})")
    if isinstance(exc, HfHubHTTPError):
        return f"{named}: the Hugging Face Hub answered {status}: {str(exc).splitlines()[0]}; try again later"
    return f"{named}: {type(exc).__name__}: {exc}"


def _named(repo_id: str, revision: str | None) -> str:
    return f"Hub model {repo_id}" + (f" at revision {revision!r}" if revision else "")


def offline_variable() -> str:
    """The variable that turned huggingface_hub's offline mode on, as the user set it."""
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if os.environ.get(name):
            return f"{name}={os.environ[name]}"
    return "HF_HUB_OFFLINE=1"


def _offline_fix(repo_id: str, revision: str | None) -> str:
    command = f"hf download {repo_id}" + (f" --revision {revision}" if revision else "")
    if constants.HF_HUB_OFFLINE:
        return (f", and {offline_variable()} forbids downloading it: unset it to download it once, or fill the cache "
                f"where there is a network (`{command}`) and copy it here, or give a local checkpoint directory")
    return f": run with the network to download it (`{command}`), or give a local checkpoint directory"
