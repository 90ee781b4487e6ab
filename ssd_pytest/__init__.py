"""The pytest and xdist machinery of the harness: YAML cases as pytest items, xdist scheduling and worker life, the
harness's reports of a pytest run. Sits on top of ``harness``; ``harness`` never imports it.

``ssd_pytest.plugin`` is the plugin (the ``pytest11`` entry point); ``ssd_pytest.private_api`` holds every use of a
third-party private API.
"""
