"""Stubborn's Python client and delegate kit.

- ``stubborn.v1``: the client, generated from proto/stubborn/v1 by protoc 3.21
  (``control_pb2``/``control_pb2_grpc`` for ControlService, ``delegate_pb2``/
  ``delegate_pb2_grpc`` for DelegateService, ``conversation_pb2`` for the
  typed conversation and answer). Never edited by hand.
- ``stubborn.delegate``: a delegate in a handful of lines (``serve`` a
  function, or a generator function that streams its answer) and the errors
  Stubborn's retry control understands (``Transient``, ``Upstream``,
  ``Permanent``, ``DoNotRetry``).
"""

__version__ = "0.1.0"
