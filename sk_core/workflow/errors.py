"""The one error type the workflow raises for bad user input; `sk` prints its message and exits 2, no traceback."""


class WorkflowError(Exception):
    """A problem the user can fix (unknown op, missing capture, malformed scenario, ...), said in one message."""
