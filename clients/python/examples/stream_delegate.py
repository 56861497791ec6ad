"""A Stubborn delegate that streams, as a model does: it writes its answer a
word at a time. Its first call breaks off after three words, as a dropped
upstream connection would (UNAVAILABLE, retry after 0.2 s); every later call
answers in full, with data at the end. Args: HOST:PORT"""

import itertools
import sys
import time

from stubborn.delegate import Transient, result, serve

calls = itertools.count(1)


def handle(request, context):
    first = next(calls) == 1
    words = f"Here is what I found for {request.brief}: all three figures are up.".split(" ")
    for i, word in enumerate(words):
        if first and i == 3:
            raise Transient("upstream connection reset mid-answer", retry_after=0.2)
        yield word if i == 0 else " " + word
        time.sleep(0.05)
    return result(data={"words": len(words), "attempt": request.attempt})


if __name__ == "__main__":
    serve(handle, sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:7501")
