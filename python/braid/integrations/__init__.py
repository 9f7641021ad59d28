"""Adapters between ``braid.Loader`` and trainers (docs/integrations.md).

- ``braid.integrations.hf``: the Hugging Face ``Trainer`` and TRL (``BraidTrainer``).
- ``braid.integrations.megatron``: Megatron-LM's external data iterator (GPT batch dicts).
- ``braid.integrations.torchtitan``: torchtitan's ``BaseDataLoader`` (``BraidDataLoader``).
- ``braid.integrations.stateful``: torchdata's ``StatefulDataLoader`` over a Loader.
- ``braid.integrations.masks``: attention masks from ``cu_seqlens``, by convention.

Each adapter translates Braid's batches and state into one trainer's shapes; ``import
braid`` needs none of the trainer libraries (``hf`` imports transformers, the others only
torch, ``torchtitan`` uses torchtitan's base class when it is installed).
"""
