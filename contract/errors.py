"""One exception type for every problem a user can cause (a bad pack, a bad
prompt, a missing GPU). The CLI prints its message as one line, no traceback."""


class StrataError(Exception):
    """A user-facing error; its message is printed as one line by the CLI."""


class PackError(StrataError):
    """The pack file is unreadable, truncated, or not what a pack of its architecture (formats/archs) must be."""


class InputError(StrataError):
    """A prompt, option or argument is invalid."""


class DeviceError(StrataError):
    """The GPU is absent, unusable, or out of memory."""


class InternalError(RuntimeError):
    """A broken invariant of the project's own code (not the user's input): a bug to report."""
