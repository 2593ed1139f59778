"""Dataset readers (JSONL, JSON, parquet, saved datasets, verl layout), row errors, the sampler."""

from __future__ import annotations

import json

import pytest

from cohort.data.datasets import DataError, RepeatSampler, load_prompt_dataset, rows_dataset


def test_jsonl_malformed_row_names_file_and_line(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"prompt": "a"}) + "\n\n" + '{"prompt": "b",}\n')
    with pytest.raises(DataError, match=rf"{path}:3: not valid JSON"):
        load_prompt_dataset([str(path)])


def test_empty_prompt_and_bad_messages(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"prompt": "ok"}) + "\n" + json.dumps({"prompt": "  "}) + "\n")
    with pytest.raises(DataError, match=rf"{path}:2: column 'prompt' is empty"):
        load_prompt_dataset([str(path)])
    path.write_text(json.dumps({"prompt": [{"role": "user"}]}) + "\n")
    with pytest.raises(DataError, match="message 0 must be a mapping with 'role' and 'content'"):
        load_prompt_dataset([str(path)])


def test_columns_pass_through_and_json_formats(tmp_path):
    rows = [{"prompt": "1+1=", "answer": "2", "level": 1}, {"prompt": "2+2=", "answer": "4", "level": 2}]
    (tmp_path / "a.json").write_text(json.dumps(rows))
    (tmp_path / "b.json").write_text(json.dumps({"data": rows}))
    ds = load_prompt_dataset([str(tmp_path / "a.json"), str(tmp_path / "b.json")])
    assert len(ds) == 4 and ds.columns == ["answer", "level"]
    assert ds.sources[2] == f"{tmp_path / 'b.json'} row 0"


def test_verl_parquet_layout(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist([
        {"data_source": "gsm8k", "prompt": [{"role": "user", "content": "What is 2+3?"}], "ability": "math",
         "reward_model": {"style": "rule", "ground_truth": "5"}, "extra_info": {"index": 0, "split": "train"}},
    ])
    pq.write_table(table, tmp_path / "verl.parquet")
    ds = load_prompt_dataset([str(tmp_path / "verl.parquet")])
    row = ds.rows[0]
    assert row["prompt"] == [{"role": "user", "content": "What is 2+3?"}]
    assert row["ground_truth"] == "5" and row["reward_style"] == "rule" and row["data_source"] == "gsm8k"


def test_in_memory_rows_read_verl_layout_and_parquet_rows_span_batches(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    ds = rows_dataset([{"prompt": "2+3=", "reward_model": {"style": "rule", "ground_truth": "5"}}], "prompt", "memory")
    assert ds.rows[0]["ground_truth"] == "5" and ds.columns == ["reward_model", "ground_truth", "reward_style"]
    # 2,500 rows are read in batches of 1,024: every row once, numbered in order across the batch boundaries
    pq.write_table(pa.Table.from_pylist([{"prompt": f"{i}=", "answer": i} for i in range(2500)]), tmp_path / "big.parquet")
    big = load_prompt_dataset([str(tmp_path / "big.parquet")])
    assert [r["answer"] for r in big.rows] == list(range(2500)) and big.sources[2499] == f"{tmp_path / 'big.parquet'} row 2499"


def test_saved_dataset_directory(tmp_path):
    from datasets import Dataset

    Dataset.from_list([{"prompt": "3+4=", "answer": "7"}]).save_to_disk(str(tmp_path / "saved"))
    ds = load_prompt_dataset([str(tmp_path / "saved")])
    assert ds.rows == [{"prompt": "3+4=", "answer": "7"}]


def test_repeat_sampler_groups_and_epochs():
    sampler = RepeatSampler(5, prompts_per_generation=2, num_generations=3, shuffle=False)
    assert sampler.next_batch() == [0, 0, 0, 1, 1, 1]
    assert sampler.next_batch() == [2, 2, 2, 3, 3, 3]
    # the epoch runs out mid-batch: continue into the next epoch, no short batch
    assert sampler.next_batch() == [4, 4, 4, 0, 0, 0]
    assert sampler.epoch == 1


def test_repeat_sampler_state_round_trip():
    a = RepeatSampler(7, 3, 2, shuffle=True, seed=5)
    a.next_prompts()
    a.next_prompts()
    b = RepeatSampler(7, 3, 2, shuffle=True, seed=5)
    b.load_state_dict(a.state_dict())
    assert [a.next_prompts() for _ in range(4)] == [b.next_prompts() for _ in range(4)]
    # each epoch is a permutation of all rows
    c = RepeatSampler(7, 7, 1, shuffle=True, seed=1)
    assert sorted(c.next_prompts()) == list(range(7))


def test_repeat_sampler_refill_groups_continue_the_stream_and_round_trip():
    sampler = RepeatSampler(5, prompts_per_generation=2, num_generations=3, shuffle=False)
    assert sampler.next_batch() == [0, 0, 0, 1, 1, 1]
    assert sampler.next_group() == [2, 2, 2]  # the prompt the next batch would have started with
    assert sampler.next_group() == [3, 3, 3]
    copy = RepeatSampler(5, 2, 3, shuffle=False)
    copy.load_state_dict(sampler.state_dict())
    assert sampler.next_batch() == copy.next_batch() == [4, 4, 4, 0, 0, 0]  # then into the next epoch
