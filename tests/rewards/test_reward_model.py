"""reward_model: a tiny sequence-classification checkpoint built here, offline."""

import pytest

from cohort.rewards import RewardSet, get

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

@pytest.fixture(scope="module")
def checkpoint(tiny_reward_model_dir):
    return tiny_reward_model_dir


def direct_score(path, text):
    tokenizer = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(path, local_files_only=True).eval()
    with torch.inference_mode():
        return model(**tokenizer(text, return_tensors="pt")).logits[0, 0].item()


def test_scores_match_a_direct_forward_and_ignore_batching(checkpoint):
    prompts = ["the answer is", "the answer is", "yes", "no"]
    completions = [" one", " two three four five", " yes yes", " no"]
    one_by_one = get("reward_model", model=str(checkpoint), batch_size=1)
    batched = get("reward_model", model=str(checkpoint), batch_size=4)
    scores_1 = one_by_one(prompts=prompts, completions=completions)
    scores_4 = batched(prompts=prompts, completions=completions)
    # padding must not change a row's score: the head reads each row's last real token
    assert scores_4 == pytest.approx(scores_1, abs=1e-5)
    assert scores_1[1] == pytest.approx(direct_score(checkpoint, "the answer is two three four five"), abs=1e-6)
    assert len(set(round(s, 6) for s in scores_1)) > 1  # not a constant


def test_chat_format_with_and_without_template(checkpoint):
    reward = get("reward_model", model=str(checkpoint))
    prompt = [{"role": "user", "content": "the answer is"}]
    completion = [{"role": "assistant", "content": "one"}]
    plain = reward(prompts=[prompt], completions=[completion])
    assert plain[0] == pytest.approx(direct_score(checkpoint, "the answer is\none"), abs=1e-6)
    reward._tokenizer.chat_template = "{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} {% endfor %}"
    templated = reward(prompts=[prompt], completions=[completion])
    assert templated[0] == pytest.approx(direct_score(checkpoint, "user : the answer is assistant : one "), abs=1e-6)


def test_in_a_reward_set_and_close(checkpoint):
    with RewardSet.from_specs([{"name": "reward_model", "model": str(checkpoint), "weight": 2.0}]) as rs:
        out = rs.score(prompts=["yes", "no"], completions=[" yes", " no"], completion_ids=[[1], [1]])
        entry_function = rs.functions[0]
    assert out.per_function.shape == (2, 1) and out.total.tolist() == pytest.approx((2 * out.per_function[:, 0]).tolist())
    assert entry_function._model is None  # closed with the set


def test_missing_checkpoint_fails_early(tmp_path):
    with pytest.raises(ValueError, match="reward_model's model = .*nope.*: not a directory; give a local transformers checkpoint"):
        get("reward_model", model=str(tmp_path / "nope"))


def test_a_reward_model_by_hub_id_and_revision_from_the_cache(checkpoint, place_in_hub, tmp_path):
    """The same checkpoint as the Hub's `org/rm` (tag `v1`): the scores are the directory's; an id missing from the
    cache (offline, as the tests run) fails when the function is built, naming the id."""
    place_in_hub("org/rm", checkpoint, commit="1" * 40, refs=("v1",))
    by_id = get("reward_model", model="org/rm", revision="v1")(prompts=["yes"], completions=[" no"])
    by_at = get("reward_model", model="org/rm@v1")(prompts=["yes"], completions=[" no"])
    assert by_id == by_at == pytest.approx([direct_score(checkpoint, "yes no")], abs=1e-6)
    with pytest.raises(ValueError, match=r"reward_model's model = 'org/rm': 'org/rm' is not a local directory, and Hub "
                                         r"model org/rm is not in the Hugging Face cache"):
        get("reward_model", model="org/rm")  # no refs/main: only v1 is cached
