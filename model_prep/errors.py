"""How the preparator fails: a check that ran and failed, and an exception as one line.

masa.common.errors.UserError is bad input (exit 2). `RunFailed` is the other
expected failure of `masa prepare`, `masa verify` and `masa profile`: the input
was valid and the command ran, but what it ran failed (the stages do not match
the whole model, ONNX Runtime failed on a stage, a profiling worker died). The
commands exit 1 for it (model_prep.cli_common).

`RunFailed` subclasses UserError on purpose: it is still one line with no
traceback, and every caller of the Python API (`prepare_network`,
`verify_network`, `profile_network`) that already stops on UserError keeps
stopping on it.
"""

from __future__ import annotations

from masa.common.errors import UserError


class RunFailed(UserError):
    """The input was fine and the command ran, but its check or run failed: exit 1."""
