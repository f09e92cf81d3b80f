"""The one exception type users see. The CLI prints it as a single line and exits with 2."""


class RpegError(Exception):
    """A problem with the user's input or request, phrased so the user can fix it."""
