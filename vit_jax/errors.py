"""The one exception type for user mistakes.

Anything a user can get wrong (a variant name, a config key, a dataset that is not prepared, a batch
size that does not split over the devices) raises `UserError` with a message that says what is wrong
and how to fix it. The CLIs catch it and print that one line; internal bugs keep their traceback.
"""


class UserError(ValueError):
  """A mistake in what the user asked for; the message says how to fix it."""
