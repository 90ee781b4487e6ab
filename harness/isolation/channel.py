"""Messages between the supervisor and its child: pickled objects, each behind an 8-byte length, over two pipes that
belong to the pair alone (stdout and stderr stay free for what kernels and providers print).

Both ends are our own code started by ``Supervisor``; pickle carries the cases and results as they are.
"""

from __future__ import annotations

import os
import pickle
import select
import struct
import time

HEADER = struct.Struct("!Q")
READ_SIZE = 1 << 20
# The longest single wait for the other end. A signal (Ctrl-C) that the kernel delivers to another thread of this
# process does not interrupt the main thread's blocking call; Python runs the handler, and raises
# KeyboardInterrupt, only once the main thread runs again. Waiting in slices bounds that delay.
WAIT_SLICE_SECONDS = 0.5


class ChannelClosed(EOFError):
    """The other end closed its pipe (in the supervisor: the child is gone, or going)."""


class Channel:
    def __init__(self, read_fd: int, write_fd: int):
        self.read_fd, self.write_fd = read_fd, write_fd

    def send(self, message) -> None:
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        view = memoryview(HEADER.pack(len(data)) + data)
        while view:
            view = view[os.write(self.write_fd, view):]

    def recv(self, deadline: float | None = None):
        """The next message. ``deadline`` (time.monotonic()): raise TimeoutError when it passes before a whole
        message arrived; raise ChannelClosed at end of file."""
        size = HEADER.unpack(self._read(HEADER.size, deadline))[0]
        return pickle.loads(self._read(size, deadline))

    def _read(self, n: int, deadline: float | None) -> bytes:
        chunks, left = [], n
        while left:
            while True:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise TimeoutError
                wait = WAIT_SLICE_SECONDS if remaining is None else min(remaining, WAIT_SLICE_SECONDS)
                if select.select([self.read_fd], [], [], wait)[0]:
                    break
            chunk = os.read(self.read_fd, min(left, READ_SIZE))
            if not chunk:
                raise ChannelClosed
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def close(self) -> None:
        for fd in (self.read_fd, self.write_fd):
            try:
                os.close(fd)
            except OSError:
                pass
