"""The one kind of error a user can fix: every problem with a recipe, a
path, a model, a run folder or a judge is a `UserError` (or a subclass that
says where it comes from). Its message is one line naming the key, path or
value and the fix; the CLI prints it and exits with code 2, never a
traceback (`--debug` shows one)."""
from __future__ import annotations


class UserError(ValueError):
    """A problem the user can fix; the message says how."""
