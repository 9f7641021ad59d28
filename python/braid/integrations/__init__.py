"""Adapters between ``braid.Loader`` and trainers.

- ``braid.integrations.megatron``: Megatron-LM's external data iterator (GPT batch dicts).
- ``braid.integrations.stateful``: torchdata's ``StatefulDataLoader`` over a Loader.

Each adapter imports only torch; the trainer library itself is never required.
"""
