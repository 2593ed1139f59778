"""Fixtures for the reward tests: a dataset in verl's parquet layout."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest


def write_verl_parquet(path, rows):
    """verl's layout (as its GSM8K/MATH preprocessing writes it): chat prompt, data_source, ability,
    reward_model {style, ground_truth}, extra_info {split, index}; rows are (data_source, question, ground truth)."""
    table = pa.Table.from_pylist([
        {"data_source": source, "prompt": [{"role": "user", "content": question}], "ability": "math",
         "reward_model": {"style": "rule", "ground_truth": truth}, "extra_info": {"split": "train", "index": i}}
        for i, (source, question, truth) in enumerate(rows)
    ])
    pq.write_table(table, path)
    return path


@pytest.fixture
def verl_parquet(tmp_path):
    """``verl_parquet(rows, name="train.parquet") -> path``."""
    return lambda rows, name="train.parquet": write_verl_parquet(tmp_path / name, rows)
