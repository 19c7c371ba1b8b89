"""Errors the command line turns into one line on stderr and exit code 2."""


class UsageError(Exception):
    """Bad input from the user: a one-line message naming the problem and what is valid."""
