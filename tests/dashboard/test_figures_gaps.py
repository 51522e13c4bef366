"""Where a line over steps breaks (figures.gaps): at a hole wider than twice the usual spacing, never at the spacing
of a sampled or phase-filtered series; a value alone between holes, or every value of a sparse series, is a point."""
import numpy as np
import pandas as pd
import pytest

from moe_monitor.dashboard.figures.gaps import SPARSE_ROWS, dots, segments, usual_spacing, with_gaps


def test_regular_steps_make_one_segment_and_no_points():
    x_T = np.arange(500, 700)
    assert usual_spacing(x_T) == 1.0 and (segments(x_T) == 0).all()
    assert not dots(segments(x_T), np.ones(x_T.size)).any()


def test_a_hole_makes_one_break():
    x_T = np.concatenate([np.arange(100), np.arange(400, 500)])
    seg_T = segments(x_T)
    assert list(np.flatnonzero(np.diff(seg_T))) == [99] and seg_T[-1] == 1
    assert not dots(seg_T, np.ones(x_T.size)).any()  # both sides are lines


def test_a_series_sampled_every_10th_step_has_no_break_and_one_missing_sample_is_no_hole():
    x_T = np.arange(0, 5000, 10)
    assert (segments(x_T) == 0).all()
    assert (segments(np.delete(x_T, 200)) == 0).all()  # a step of 20 is not wider than twice 10
    assert segments(np.delete(x_T, [200, 201])).max() == 1  # a step of 30 is


def test_one_phase_of_interleaved_steps_has_no_spurious_break():
    step_T = np.arange(2000)
    prefill_T = step_T % 10 == 0  # a prefill step every tenth, decode between
    assert (segments(step_T[~prefill_T]) == 0).all() and (segments(step_T[prefill_T]) == 0).all()
    alternate_T = step_T % 2 == 0  # one phase every other step: a spacing of 2 throughout
    assert (segments(step_T[alternate_T]) == 0).all() and (segments(step_T[~alternate_T]) == 0).all()
    decode = step_T[~prefill_T]
    holed = decode[(decode < 500) | (decode > 900)]  # a rank down for 400 steps: a hole within the phase
    assert segments(holed).max() == 1


def test_a_missing_rollup_bucket_run_breaks_a_time_axis():
    starts = (np.concatenate([np.arange(60), np.arange(70, 100)]) * 60).astype("datetime64[s]")
    assert usual_spacing(starts) == 60_000.0  # milliseconds
    assert segments(starts).max() == 1


def test_a_value_alone_between_holes_or_between_nans_is_a_point():
    x_T = np.concatenate([np.arange(100), [150], np.arange(200, 300)])
    y_TS = np.ones((x_T.size, 2))
    assert list(np.flatnonzero(dots(segments(x_T), y_TS))) == [100]
    y_TS[101:201, 1] = np.nan  # the second series has nothing after the lone step: still only that row
    assert list(np.flatnonzero(dots(segments(x_T), y_TS))) == [100]
    regular = np.arange(100)
    y_T = np.ones(100)
    y_T[[39, 41]] = np.nan  # step 40's neighbours have no value: a line cannot show it
    assert list(np.flatnonzero(dots(segments(regular), y_T))) == [40]


def test_every_value_of_a_sparse_series_is_a_point():
    x_T = np.arange(0, SPARSE_ROWS * 7, 7)
    y_T = np.ones(x_T.size)
    y_T[3] = np.nan
    dot_T = dots(segments(x_T), y_T)
    assert dot_T.sum() == SPARSE_ROWS - 1 and not dot_T[3]
    assert not dots(segments(np.arange(SPARSE_ROWS + 1)), np.ones(SPARSE_ROWS + 1)).any()


def test_with_gaps_adds_segment_and_dot_per_group_and_keeps_the_rows():
    frame = pd.DataFrame({"kind": ["a"] * 60 + ["b"] * 60,
                          "delta": np.concatenate([np.arange(60), np.r_[0:30, 40:70]]), "v": np.ones(120)})
    out = with_gaps(frame, ["v"], x="delta", by=["kind"])
    assert list(out.columns) == ["kind", "delta", "v", "segment", "dot"] and out.index.equals(frame.index)
    assert out["segment"][:60].max() == 0 and list(out["segment"][60:].unique()) == [0, 1]
    assert out["segment"].dtype == np.uint8 and not out["dot"].any()
    empty = with_gaps(pd.DataFrame({"x": np.zeros(0, np.int64), "v": np.zeros(0)}), ["v"])
    assert empty.empty and list(empty.columns) == ["x", "v", "segment", "dot"]
    one = with_gaps(pd.DataFrame({"x": [5], "v": [1.0]}), ["v"])
    assert list(one["segment"]) == [0] and list(one["dot"]) == [True]


def test_bad_arguments_say_what_is_wrong():
    with pytest.raises(ValueError, match="gap_factor"):
        segments(np.arange(5), gap_factor=1.0)
    with pytest.raises(ValueError, match="rows of values"):
        dots(np.zeros(3, np.uint8), np.ones(4))
