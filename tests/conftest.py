"""Unit tests measure into a private speed-profile cache, never the learner's ~/.cache/amp-course."""
import itertools

import pytest

_fresh = itertools.count()


@pytest.fixture(autouse=True)
def private_speed_cache(tmp_path_factory, monkeypatch):
    """A cache directory of this test's own (not created until something is cached in it)."""
    directory = tmp_path_factory.getbasetemp() / f"amp-course-cache-{next(_fresh)}"
    monkeypatch.setenv("AMP_COURSE_CACHE", str(directory))
