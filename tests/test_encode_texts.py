"""`encode_texts`: a dataset's prompts tokenized once in their shared head and tail (a chat template's system turn and
tools block, its assistant header) and per row only in their middle, giving exactly what tokenizing each whole gives;
and whole when a tokenizer's added tokens would not split cleanly there."""

from __future__ import annotations

from tokenizers import AddedToken
from transformers import AutoTokenizer

from cohort.prompts import ENCODE_CHECKED_ROWS, _shared_ends, encode_texts
from cohort.tools.builtin import calculator
from cohort.tools.tool_schemas import resolve_tools


def _whole(tok, texts):
    return [list(tok(text, add_special_tokens=False)["input_ids"]) for text in texts]


def _chat_texts(tok, n=60):
    # questions that vary in length, in leading and trailing whitespace and in newlines, so the middles' own merges
    # (a space or a newline beside the header's) are what a wrong cut would change
    tools = [t.schema for t in resolve_tools([calculator])]
    questions = [f"{' ' * (i % 3)}{17 * i}*{i % 97}={' x' * (i % 4)}{chr(10) * (i % 2)}" for i in range(n)]
    return [tok.apply_chat_template([{"role": "user", "content": q}], tools=tools, tokenize=False, add_generation_prompt=True)
            for q in questions]


def test_chat_prompts_with_a_tools_block_encode_exactly_as_each_whole_and_the_cuts_sit_at_chatml_tokens(tiny_chat_model_dir):
    tok = AutoTokenizer.from_pretrained(str(tiny_chat_model_dir))
    texts = _chat_texts(tok)
    head_len, tail_len = _shared_ends(tok, texts)
    # the head ends right after the user turn's <|im_start|> (what follows, "user\n" + the question, varies only after
    # "user\n", which stays in the middle); the tail starts at the question's <|im_end|>
    assert texts[0][:head_len].endswith("<|im_start|>") and "<tools>" in texts[0][:head_len]
    assert texts[0][len(texts[0]) - tail_len:] == "<|im_end|>\n<|im_start|>assistant\n"
    assert encode_texts(tok, texts) == _whole(tok, texts)


class _Claims:
    """The real tokenizer, but listing other added tokens than it has (a unit test of the cut logic alone)."""

    def __init__(self, tok, added):
        self.tok, self.added_tokens_decoder = tok, dict(enumerate(added))

    def __call__(self, text, **kwargs):
        return self.tok(text, **kwargs)


def test_cuts_only_at_added_tokens_that_split_cleanly_and_a_cut_that_changes_a_text_encodes_every_text_whole(tiny_chat_model_dir):
    tok = AutoTokenizer.from_pretrained(str(tiny_chat_model_dir))
    texts = _chat_texts(tok, 20)
    im_start = tok.added_tokens_decoder[tok.convert_tokens_to_ids("<|im_start|>")]
    # an added token that strips the whitespace beside it (as some checkpoints' <mask> does) is never a cut
    stripping = AddedToken("<|im_start|>", rstrip=True, lstrip=False, single_word=False, normalized=False, special=True)
    assert _shared_ends(_Claims(tok, [stripping]), texts) is None
    assert _shared_ends(_Claims(tok, [im_start]), texts) is not None
    # "<|im_start|>us" claimed as an added token: the real tokenizer has "user" as one token, so a cut after "us"
    # changes the encoding; the check on the first rows finds the difference and every text is encoded whole, exactly
    inside_a_word = AddedToken("<|im_start|>us", rstrip=False, lstrip=False, single_word=False, normalized=False, special=True)
    claims = _Claims(tok, [inside_a_word])
    head_len, _ = _shared_ends(claims, texts)
    assert texts[0][:head_len].endswith("<|im_start|>us") and texts[0][head_len:].startswith("er\n")
    split = list(tok(texts[0][:head_len], add_special_tokens=False)["input_ids"]) + \
        list(tok(texts[0][head_len:], add_special_tokens=False)["input_ids"])
    assert split != _whole(tok, texts[:1])[0]  # the cut would have changed the encoding...
    assert encode_texts(claims, texts) == _whole(tok, texts)  # ...so nothing was cut


def test_few_texts_or_texts_that_share_nothing_are_encoded_whole(tiny_chat_model_dir):
    tok = AutoTokenizer.from_pretrained(str(tiny_chat_model_dir))
    few = _chat_texts(tok, ENCODE_CHECKED_ROWS)
    assert encode_texts(tok, few) == _whole(tok, few)
    plain = [f"{i} plus {i} is" for i in range(20)]  # plain-text prompts: no added token in common
    assert _shared_ends(tok, plain) is None and encode_texts(tok, plain) == _whole(tok, plain)
