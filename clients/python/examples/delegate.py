"""A Stubborn delegate: its first call fails as a rate-limited upstream would
(HTTP 429, retry after 0.3 s), every later call answers. Args: HOST:PORT"""

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
