"""Right padding and length-sorted micro-batches."""

from cohort.models.batching import length_sorted_micro_batches, pack_right_padded


def test_pack_right_padded_layout():
    b = pack_right_padded([[1, 2], [3]], [[4, 5, 6], [7]], pad_id=0)
    assert b.input_ids.tolist() == [[1, 2, 4, 5, 6], [3, 7, 0, 0, 0]]
    assert b.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]]
    assert b.prompt_lengths.tolist() == [2, 1]
    assert b.completion_ids.tolist() == [[4, 5, 6], [7, 0, 0]]
    assert b.completion_mask.tolist() == [[1, 1, 1], [1, 0, 0]]
    # 3 padding cells of 10
    assert abs(b.padding_fraction - 0.3) < 1e-12


def test_micro_batches_sorted_and_complete():
    lengths = [3, 9, 1, 7, 5]
    mbs = length_sorted_micro_batches(lengths, 2)
    assert mbs == [[1, 3], [4, 0], [2]]
    assert sorted(i for mb in mbs for i in mb) == list(range(5))
