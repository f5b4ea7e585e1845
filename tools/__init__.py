"""Course tooling: not installed with the helpers, run from the project root as `python -m tools.NAME`."""
