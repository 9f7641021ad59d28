"""The Ray transport of Braid's roles (docs/distributed.md).

The roles are the C++ services of ``cpp/src/braid/service/`` (planner, sources,
constructor) hosted in Ray actors; this package only moves their messages (NumPy arrays)
between processes and starts the actors:

- ``hosts.py``: the actors (``PlannerHost``; ``NodeHost``, a node's constructor and the
  sources placed there; ``SourcesHost``), each method a call of a service, and
  ``RayTransport``, the constructor service's ports over Ray.
- ``job.py``: a job's named, detached actors: create or attach, detach;
  ``registry.py``: find, report and remove them by name (``braid status``/``stop``).
- ``client.py``: the trainer side, the rank's stream that ``braid.Loader`` iterates with
  ``runtime: {kind: ray}``; ``node_delivery.py``, ``names.py`` and ``attach.py``: its
  default channel (``runtime.delivery: node``), a Unix socket and shared-memory files
  from the node's constructor, so the trainer process never imports Ray.
- ``run.py``: ``braid run --runtime ray``.

Importing ``braid`` never imports Ray; this package imports it and fails with a clear
message when it is missing (``pip install 'braid[ray]'``).
"""
