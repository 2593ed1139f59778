"""``reward_model``: a transformers sequence-classification checkpoint as a reward.

Choices:
- ``model`` is a Hugging Face Hub id (``org/name``; ``revision`` or ``org/name@rev``
  for a revision) or a local directory saved with ``save_pretrained``, resolved like
  model.path (cohort.models.pretrained.resolve_model_dir: a Hub id is downloaded once into
  the Hugging Face cache, as the user's HF_HOME / HF_HUB_OFFLINE / HF_TOKEN allow). It
  is checked when the function is built (a Hub id's config and tokenizer only); the
  weights load at the first call (so building a RewardSet stays cheap), in eval mode,
  on ``device``.
- The text scored is prompt + completion. Chat-format prompts and completions go
  through the tokenizer's chat template when it has one (messages of the prompt, then
  the completion's messages); otherwise message contents are joined with newlines.
  Plain strings are concatenated as they are.
- The score is ``logits[:, label_index]`` (a one-label head's only logit by default),
  computed in batches of ``batch_size``, right-padded, truncated to ``max_length``
  tokens (keeping the start). A tokenizer without a pad token pads with its EOS, and
  the model config learns that pad id (classification heads use it to find the last
  real token).
- The function is sync; torch releases the GIL in its kernels, so it runs well on
  the RewardSet's thread pool.
"""

from __future__ import annotations

import threading
from typing import Any

from cohort.rewards.reward_registry import register
from cohort.rewards.text import content_text


def _as_messages(value: Any, default_role: str) -> list[dict[str, Any]]:
    if isinstance(value, str):
        return [{"role": default_role, "content": value}]
    if isinstance(value, dict):
        return [value]
    return [m for m in value if isinstance(m, dict)]


class RewardModel:
    __name__ = "reward_model"

    def __init__(self, model: str, batch_size: int, max_length: int, device: str, label_index: int, revision: str | None = None):
        from cohort.models.pretrained import check_model_dir  # here: it loads torch, and listing rewards must not

        problems = check_model_dir(model, revision)
        if problems or model.startswith("tiny:"):
            raise ValueError("reward_model's " + (problems[0].replace("model.path", "model", 1) if problems else
                             f"model = {model!r}: a tiny model is no sequence classifier; give a Hub id or a directory"))
        if batch_size < 1 or max_length < 1:
            raise ValueError(f"reward_model needs batch_size >= 1 and max_length >= 1; got {batch_size}, {max_length}")
        self.path, self.revision = model, revision
        self.batch_size = batch_size
        self.max_length = max_length
        self.device = device
        self.label_index = label_index
        self._lock = threading.Lock()
        self._model = None
        self._tokenizer = None

    def _load(self) -> None:
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        from cohort.models.pretrained import resolve_model_dir  # (torch, as check_model_dir above)

        directory = str(resolve_model_dir(self.path, self.revision))  # (a Hub id: its snapshot, downloaded if missing)
        tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
        model = AutoModelForSequenceClassification.from_pretrained(directory, local_files_only=True)
        if tokenizer.pad_token is None:
            if tokenizer.eos_token is None:
                raise ValueError(f"the tokenizer in {self.path!r} has neither a pad nor an EOS token")
            tokenizer.pad_token = tokenizer.eos_token
        tokenizer.padding_side = "right"
        model.config.pad_token_id = tokenizer.pad_token_id
        self._tokenizer, self._model = tokenizer, model.to(self.device).eval()

    def text(self, prompt: Any, completion: Any) -> str:
        """The string the model scores for one row."""
        if isinstance(prompt, str) and isinstance(completion, str):
            return prompt + completion
        messages = _as_messages(prompt, "user") + _as_messages(completion, "assistant")
        if getattr(self._tokenizer, "chat_template", None):
            return self._tokenizer.apply_chat_template(messages, tokenize=False)
        return "\n".join(content_text(m.get("content")) for m in messages)

    def __call__(self, *, prompts: list[Any], completions: list[Any], **_: Any) -> list[float]:
        import torch

        with self._lock:
            if self._model is None:
                self._load()
            texts = [self.text(p, c) for p, c in zip(prompts, completions, strict=True)]
            scores: list[float] = []
            for start in range(0, len(texts), self.batch_size):
                batch = self._tokenizer(
                    texts[start : start + self.batch_size],
                    padding=True,
                    truncation=True,
                    max_length=self.max_length,
                    return_tensors="pt",
                ).to(self.device)
                with torch.inference_mode():
                    logits = self._model(**batch).logits  # (B, num_labels)
                scores.extend(logits[:, self.label_index].float().cpu().tolist())
            return scores

    def close(self) -> None:
        with self._lock:
            self._model = None
            self._tokenizer = None


@register("reward_model")
def reward_model(
    *,
    model: str,
    batch_size: int = 8,
    max_length: int = 2048,
    device: str = "cpu",
    label_index: int = 0,
    revision: str | None = None,
) -> RewardModel:
    """A sequence-classification checkpoint's logit for prompt + completion.

    model is a Hugging Face Hub id (downloaded once into the HF cache; revision: a
    branch, tag or commit) or a directory saved with save_pretrained; chat
    prompts/completions use the tokenizer's chat template. Scores are
    logits[:, label_index], computed in batches of batch_size.
    """
    return RewardModel(model, batch_size, max_length, device, label_index, revision)

