import pytest
import sys
sys.path.insert(0, '/app')
from calc import mean


def test_mean():
    assert mean([1, 2, 3, 4]) == 2.5


def test_single():
    assert mean([7]) == 7


def test_empty():
    with pytest.raises(ValueError):
        mean([])
