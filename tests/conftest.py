"""Unit tests measure into a private speed-profile cache, never the learner's ~/.cache/amp-course."""
import pytest


@pytest.fixture(autouse=True)
def private_speed_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("AMP_COURSE_CACHE", str(tmp_path / "amp-course-cache"))
