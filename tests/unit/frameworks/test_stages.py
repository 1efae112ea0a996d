"""DeepSpeed pipelines cut at the Layout's stage sizes (holmes.launch.stages)."""

import pytest

from holmes.launch.stages import StageError, stage_bounds


def test_bounds_put_each_stages_layer_count_and_keep_the_ends():
    # embedding, 8 transformer blocks, final norm, head: stages of 3, 3 and 2 blocks
    is_layer = [False] + [True] * 8 + [False, False]
    assert stage_bounds(is_layer, [3, 3, 2]) == [0, 4, 7, 11]
    assert stage_bounds(is_layer, [1, 6, 1]) == [0, 2, 8, 11]
    assert stage_bounds([True] * 5, [5]) == [0, 5]


def test_bounds_refuse_another_layer_count():
    with pytest.raises(
        StageError, match="holds 8 transformer layers but the Layout's stages hold 9 \\(3\\+3\\+3\\)"
    ):
        stage_bounds([True] * 8, [3, 3, 3])
