"""The Ray transport of Braid's roles (docs/distributed.md).

The roles are the C++ services of ``cpp/src/braid/service/`` (planner, payloads,
construction) hosted in Ray actors; this package only moves their messages (NumPy arrays)
between processes and supervises the actors:

- ``actors.py``: ``PlannerActor``, ``SourceActor`` (the sources' payloads by key),
  ``ConstructorActor`` (builds each bucket's micro-batches once per node).
- ``job.py``: a job's named, detached actors: create or attach, status, stop.
- ``client.py``: the trainer side, what ``braid.Loader`` iterates with
  ``runtime: {kind: ray}``; ``node_delivery.py``, ``names.py`` and ``attach.py``: its
  default channel (``runtime.delivery: node``), a Unix socket and shared-memory files
  from the node's constructor, so the trainer process never imports Ray.

Importing ``braid`` never imports Ray; this package imports it and fails with a clear
message when it is missing (``pip install 'braid[ray]'``).
"""
