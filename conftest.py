"""Root conftest: load the harness's pytest plugin (YAML cases as items, --device/--provider, xdist pinning)."""

pytest_plugins = ["harness.pytest_plugin"]
