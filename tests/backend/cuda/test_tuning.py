"""The tuning tables' mechanism (backend/cuda/tuning.py): frozen entries, overrides that come back, watchers."""
import pytest

from smalltrain.backend.cuda.tuning import Tuning, override


def _table():
    return Tuning("demo", rows=(4, "rows per block"), threads=(256, "threads per block"))


def test_entries_read_as_attributes_with_their_reasons():
    table = _table()
    assert (table.rows, table.threads) == (4, 256)
    assert table.entries() == {"rows": (4, "rows per block"), "threads": (256, "threads per block")}
    with pytest.raises(AttributeError, match="no entry 'cols'"):
        table.cols


def test_a_table_is_frozen():
    table = _table()
    with pytest.raises(AttributeError, match="frozen"):
        table.rows = 8
    assert table.rows == 4


def test_override_sets_entries_for_the_block_and_restores_them_after_an_error():
    table = _table()
    with override(table, rows=1):
        assert (table.rows, table.threads) == (1, 256)
    assert table.rows == 4
    with pytest.raises(RuntimeError):
        with override(table, threads=32):
            raise RuntimeError("inside")
    assert table.threads == 256


def test_override_refuses_unknown_entries():
    with pytest.raises(KeyError, match=r"no entries \['cols'\]"):
        with override(_table(), cols=3):
            pass


def test_watchers_run_when_an_override_starts_and_ends():
    table, calls = _table(), []
    table.watch(lambda: calls.append(table.rows))
    with override(table, rows=2):
        assert calls == [2]
    assert calls == [2, 4]


def test_entries_need_a_reason():
    with pytest.raises(TypeError, match="must be \\(value, reason\\)"):
        Tuning("demo", rows=4)
