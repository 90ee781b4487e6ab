"""``python -m harness``: see ``harness.cli``."""

import os
import sys

from harness.isolation.settings import ISOLATION_ENV

# The commands whose items run in a supervised child fork it here, right after torch's import and before anything
# touches CUDA or runs a torch op (``harness.isolation.forking`` says why only then): the child then need not
# import torch again. Under ``--isolation none`` the spare is never used and ends with this process.
ITEM_COMMANDS = ("run", "repro", "fuzz")

if sys.argv[1:2] and sys.argv[1] in ITEM_COMMANDS and os.environ.get(ISOLATION_ENV) != "none":
    import torch  # noqa: F401

    from harness.isolation import spare

    spare.prefork(spare.CLI)

from harness.cli import main  # noqa: E402

sys.exit(main())
