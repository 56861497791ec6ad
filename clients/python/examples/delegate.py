"""A Stubborn delegate in Python: its first call fails as if the service
behind it had answered 429 Too Many Requests with Retry-After: 0.3; every
later call answers. Stubborn's retry control waits the 0.3 s, then retries.

    python3 examples/delegate.py 127.0.0.1:7500
"""

import itertools
import sys

from stubborn.delegate import Upstream, serve

calls = itertools.count(1)


def handle(request, context):
    if next(calls) == 1:
        raise Upstream(429, "rate limited upstream", retry_after=0.3)
    return f"done: {request.brief} (attempt {request.attempt})"


if __name__ == "__main__":
    serve(handle, sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:7500")
