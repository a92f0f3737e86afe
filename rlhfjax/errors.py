"""Errors the user can fix; the command line prints them as one line instead of a traceback."""


class ConfigError(ValueError):
  """A configuration value is wrong; the message names the config key."""


class DataError(ValueError):
  """An input file is malformed; the message names the file and line."""
