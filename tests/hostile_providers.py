"""Providers whose output or side effects test how truthfully the harness reports them, each around the reference
provider: ``leaves_a_helper`` starts a helper process on its first call and leaves it running, as compile workers or
helper servers do (the harness must end it with the process that ran the provider; ``SSD_TEST_PID_FILE``, as in
``tests.faulty_providers``, receives the helper's process id); ``writes_nan`` fills its output with NaN (every
element's error unbounded)."""

from __future__ import annotations

import os
import subprocess

from tests.broken_providers import _Broken
from tests.faulty_providers import PID_FILE_ENV


class LeavesAHelper(_Broken):
    breakage = "starts `sleep 600` on its first call and never waits for it"

    def __init__(self):
        super().__init__(base="reference:provider")
        self.helper = None

    def call(self, *args, **kwargs):
        if self.helper is None:
            self.helper = subprocess.Popen(["sleep", "600"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                           stderr=subprocess.DEVNULL)
            with open(os.environ[PID_FILE_ENV], "a", encoding="utf-8") as fh:
                fh.write(f"{self.helper.pid}\n")
        return self.inner.ssd_prefill(*args, **kwargs)


class WritesNaN(_Broken):
    breakage = "overwrites its whole output with NaN"

    def __init__(self):
        super().__init__(base="reference:provider")

    def call(self, *args, out, **kwargs):
        result = self.inner.ssd_prefill(*args, out=out, **kwargs)
        out.fill_(float("nan"))
        return result


leaves_a_helper = LeavesAHelper()
writes_nan = WritesNaN()
