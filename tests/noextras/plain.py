# Run by tests/noextras/check.py (tox -e noextras), not by the suite: the file name does not match test_*.py.
def test_arithmetic():
    assert sum([1, 2, 3]) == 6
