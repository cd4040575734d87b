"""The one exception type for mistakes a user can make (paths, config, data).

The CLI turns a UserError into a single line on stderr and exit code 2; anything else is a bug
and keeps its traceback.
"""


class UserError(Exception):
    """A problem the user can fix: bad path, bad config value, unusable data."""
