# Run by tests/noextras/check.py (tox -e noextras), not by the suite: the file name does not match test_*.py.
# Without the [hf] extra this test must fail, naming the extra, and leave the session to the other tests.
def test_tiny_llama(llmperf, llmperf_hf):
    llmperf.measure(llmperf_hf("tiny-llama"))
