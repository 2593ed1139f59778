"""Checks of on-policy distillation's teacher (`algorithm.name = distill`, the `teacher` section), before anything loads.

`teacher_problems(cfg, check_files)` is one part of `cohort.plan.validate.validate_config`:

- the section against the algorithm: distill needs teacher.path (a missing teacher is
  refused with the fix), and a teacher.path under another algorithm would be read by
  nothing, so it is refused too (set algorithm.name=distill, or unset it);
- ranges: teacher.kl_coef > 0, teacher.reward_weight >= 0, teacher.log_ratio_clip > 0;
  a reward weight needs groups (GRPO's advantage of a group of one is 0);
- with check_files, the teacher's directory as model.path's is checked (the same
  `check_model_dir`, named teacher.path), its tokenizer files, and the shared tokenizer:
  the teacher scores the student's token ids, so both must map every token to the same
  id. Two tokenizers (local directories, built tiny models, Hub snapshots without their
  weights) are loaded, never the weights, and
  their vocabularies compared; an embedded tiny model not built yet is compared by the
  tokenizer its recipe writes.

`teacher_fit_problems(cfg, plan)` asks that the teacher's positions hold the run's
longest sequence (the plan's bound: the longest prompt kept + the completion).

`tokenizer_mismatch(student, teacher)` is the comparison itself; the trainer's setup
asks it again of the loaded tokenizers before the teacher's weights load (a teacher
that validation could not read as a local directory is still refused before loading).

Left out: teachers with another tokenizer (cross-tokenizer distillation aligns text
spans, which needs both models' full distributions), and the teacher's memory, which
is a row of the planner's estimate (`cohort.plan.memory.memory_estimate`) and so part of the
GPU plan's refusal.
"""

from __future__ import annotations

from pathlib import Path

from cohort.config import CohortConfig
from cohort.models import hub, pretrained
from cohort.models.tiny import TINY_RECIPES, available_tiny_dir
from cohort.models.tokenizer_check import tokenizer_file_problems
from cohort.plan.batch import BatchPlan
from cohort.prompts import max_positions_of


def teacher_problems(cfg: CohortConfig, check_files: bool = True, *, student_readable: bool = True,
                     student_tokenizer=None) -> list[str]:
    """Every problem of the teacher section against the algorithm, its ranges and (with files) the teacher itself.
    `student_readable`: model.path passed its own `check_model_dir` (validate_config asked it already);
    `student_tokenizer`: model.path's tokenizer when validation has loaded it (else it is loaded here to compare)."""
    t = cfg.teacher
    if cfg.algorithm.name != "distill":
        return [] if t.path is None else [
            f"teacher.path = {t.path!r} is read only by algorithm.name = distill (this run is {cfg.algorithm.name}): set "
            "algorithm.name=distill (teacher.reward_weight > 0 keeps the rewards in the advantage), or unset teacher.path"]
    problems = []
    if t.path is None:
        problems.append("algorithm.name = distill needs a teacher: set teacher.path to the teacher's checkpoint (a local "
                        "transformers directory or tiny:<task>) that shares model.path's tokenizer")
    if t.kl_coef <= 0:
        problems.append(f"teacher.kl_coef = {t.kl_coef}: must be > 0 (the weight of the teacher's per-token advantage; 1.0 "
                        "is the usual value)")
    if t.reward_weight < 0:
        problems.append(f"teacher.reward_weight = {t.reward_weight}: must be >= 0 (0 distils alone, e.g. 1.0 adds the "
                        "rewards' GRPO advantage)")
    elif t.reward_weight > 0 and cfg.rollout.num_generations < 2:
        problems.append(f"teacher.reward_weight = {t.reward_weight} with rollout.num_generations = "
                        f"{cfg.rollout.num_generations}: the rewards' GRPO advantage of a group of one is 0, so they would "
                        "never count; use rollout.num_generations >= 2, or teacher.reward_weight=0")
    if t.log_ratio_clip is not None and t.log_ratio_clip <= 0:
        problems.append(f"teacher.log_ratio_clip = {t.log_ratio_clip}: must be > 0 nats (10.0 is verl's recipes' value), "
                        "or unset it (null) for no clip")
    if check_files and t.path is not None:
        problems += _teacher_files(cfg, student_readable, student_tokenizer)
    return problems


def _teacher_files(cfg: CohortConfig, student_readable: bool, student_tokenizer) -> list[str]:
    """teacher.path as a checkpoint (the checks of model.path, named teacher.path), then the shared tokenizer."""
    path = cfg.teacher.path
    found = [p.replace("model.path", "teacher.path", 1) for p in pretrained.check_model_dir(path)]
    found = found or tokenizer_file_problems(path, "teacher.path")
    if found or not student_readable or tokenizer_file_problems(cfg.model.path):
        return found  # (a student that cannot be read is reported by model.path's own checks)
    student, teacher = _tokenizer_source(cfg.model.path, cfg.model.revision), _tokenizer_source(path)
    if isinstance(student, Path) and isinstance(teacher, Path):
        try:
            student_tokenizer = pretrained.load_tokenizer(student) if student_tokenizer is None else student_tokenizer
        except pretrained.ModelLoadError:  # (model.path's own tokenizer check reports it)
            return []
        try:
            mismatch = tokenizer_mismatch(student_tokenizer, pretrained.load_tokenizer(teacher))
        except pretrained.ModelLoadError as exc:
            return [f"teacher.path = {path!r}: {exc}"]
    elif isinstance(student, tuple) and isinstance(teacher, tuple):  # two embedded tiny models, not built yet
        mismatch = None if student == teacher else "their recipes write different tokenizers"
    else:
        return []  # (a built tiny model beside an unbuilt one: compared at setup, before the teacher's weights load)
    return [] if mismatch is None else [mismatch_problem(cfg, mismatch)]


def _tokenizer_source(path: str, revision: str | None = None) -> Path | tuple | None:
    """A directory to load the tokenizer from (a local checkpoint, a built tiny model, a Hub model's snapshot without its
    weights); for an unbuilt tiny model, what determines the tokenizer its recipe writes; None otherwise."""
    if path.startswith("tiny:"):
        name = path.split(":", 1)[1]
        built = available_tiny_dir(name)
        if built is not None:
            return built
        recipe = TINY_RECIPES[name]
        return (type(recipe).write_tokenizer.__qualname__, getattr(recipe, "vocab_size", None),
                getattr(recipe, "default_system", None))
    local = Path(path).expanduser()
    if not local.is_dir() and hub.looks_like_hub_id(path):
        try:
            return hub.hub_snapshot(path, revision, weights=False)  # (config and tokenizer only: check_model_dir got them)
        except hub.HubModelError:
            return None  # (check_model_dir reported it)
    return local if (local / "config.json").is_file() else None


def tokenizer_mismatch(student, teacher) -> str | None:
    """None when the two tokenizers map every token to the same id; else what differs, with an example."""
    s_vocab, t_vocab = student.get_vocab(), teacher.get_vocab()
    if s_vocab == t_vocab:
        return None
    differing = sorted(tok for tok, i in s_vocab.items() if t_vocab.get(tok) != i)
    extra = len(set(t_vocab) - set(s_vocab))
    if not differing:
        return f"the teacher's vocabulary has {extra} token(s) the student's lacks ({len(t_vocab)} against {len(s_vocab)})"
    token = differing[0]
    return (f"{len(differing)} of the student's {len(s_vocab)} tokens have another id or none in the teacher's "
            f"({token!r}: {s_vocab[token]} in the student's, {t_vocab.get(token)} in the teacher's)")


def mismatch_problem(cfg: CohortConfig, mismatch: str) -> str:
    """The refusal of a teacher whose tokenizer differs from the student's, with the fix."""
    return (f"teacher.path = {cfg.teacher.path!r} and model.path = {cfg.model.path!r} do not share a tokenizer: {mismatch}. "
            "On-policy distillation scores the student's sampled token ids with the teacher, so both must use one "
            "tokenizer; choose a teacher of the student's family (e.g. a checkpoint trained from model.path, or a larger "
            "model of the same release that ships the same tokenizer)")


def teacher_fit_problems(cfg: CohortConfig, plan: BatchPlan) -> list[str]:
    """The teacher's max_position_embeddings must hold the longest sequence the plan bounds (prompt + completion)."""
    if cfg.algorithm.name != "distill" or cfg.teacher.path is None or plan.max_tokens_per_sequence is None:
        return []
    positions = max_positions_of(cfg.teacher.path)
    longest = plan.max_tokens_per_sequence
    if positions is None or longest <= positions:
        return []
    return [f"teacher.path = {cfg.teacher.path!r} holds max_position_embeddings = {positions}, less than the run's longest "
            f"sequence {longest} ({plan.prompt_tokens_from} + rollout.max_completion_length "
            f"{cfg.rollout.max_completion_length}); lower rollout.max_completion_length or data.max_prompt_length to fit "
            f"{positions}, or choose a teacher with longer positions"]
