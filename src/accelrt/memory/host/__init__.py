"""The host (pinned) caching allocator (PyTorch's ``CachingHostAllocator`` policy) and
``HostBuffer``; it reuses the device allocator's statistics and stream-event code.
``accelrt.memory`` re-exports the public names.
"""
