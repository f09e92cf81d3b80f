"""The exceptions users see. The CLI prints each as a single line: exit 2 for a problem with the
input, exit 3 for a valid job that does not fit the devices asked for."""


class RpegError(Exception):
    """A problem with the user's input or request, phrased so the user can fix it."""


class DoesNotFit(RpegError):
    """A valid job that fits in no layout on the devices given (more GPUs or a larger device would help)."""


class PassRefused(RpegError):
    """A pass declined the graph it was given (an illegal combination, a layout that does not divide).
    For a user it is an error like any other; the plan search expects it and skips that candidate,
    and only it: any other exception from a pass is a bug and propagates."""
