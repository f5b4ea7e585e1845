"""Unit tests measure into a private speed-profile cache, never the learner's ~/.cache/amp-course; and every
notebook cell nbval collects is marked ``slow``, so ``pytest -m "not slow"`` is the fast loop (CONTRIBUTING)."""
import itertools

import pytest

_fresh = itertools.count()


@pytest.fixture(autouse=True)
def private_speed_cache(tmp_path_factory, monkeypatch):
    """A cache directory of this test's own (not created until something is cached in it)."""
    directory = tmp_path_factory.getbasetemp() / f"amp-course-cache-{next(_fresh)}"
    monkeypatch.setenv("AMP_COURSE_CACHE", str(directory))


def pytest_collection_modifyitems(config, items):
    """A notebook's cells run its whole kernel: slow, whatever a cell's own time (nbval collects them)."""
    for item in items:
        if str(item.path).endswith(".ipynb"):
            item.add_marker(pytest.mark.slow)
