"""Root conftest: load the harness's pytest plugin (YAML cases as items, --device/--provider, xdist pinning) from this
checkout. Where the package is installed, its ``pytest11`` entry point has the same name and has loaded it already,
so pytest does not load it again."""

pytest_plugins = ["ssd_pytest.plugin"]
