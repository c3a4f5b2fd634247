"""Memory handles: ``Buffer`` (device memory; its Python-level part, which the compiled type
adopts), what it shares with ``HostBuffer`` (exports, the finaliser), and DLPack capsules.
``accelrt.memory`` re-exports the public names.
"""
