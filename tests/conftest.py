import pytest


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory):
    """Embedded models built once per test session, outside the user's cache."""
    import os

    cached = os.environ.get("LLMPERF_TEST_MODEL_CACHE")
    return cached if cached else str(tmp_path_factory.mktemp("models"))
