# cython: language_level=3
"""Compiled hot paths of streams: ``Stream.query``/``synchronize``, a queue stream's
``synchronize`` and OpenCL's ``memcpy_async`` without a Python frame (docs/design.md).

``StreamCore`` holds ``accelrt.Stream``'s fields and its two per-call methods; ``Stream``
(_stream.py) derives from it. ``QueueStreamOps`` holds the fields of a backend's per-stream
object whose stream is an in-order queue and its ``synchronize``; ``SVMStreamOps`` adds the
copies of a queue whose copies are SVM memcpys through PyOpenCL (the base of OpenCL's
``_CLStream``). Where this module is not built, or ``ACCELRT_PURE_PYTHON`` is set, their
Python twins (``_stream._StreamFields``, ``backends._base._QueueStreamFields``,
``backends.opencl._SVMStreamFields``) are the bases instead; the conformance tests run on both.

A Python call costs about 25 ns; an idle ``clFinish`` through PyOpenCL about 80 ns. Two Python
frames (the public method, the backend's) on top of it were 1.45x the raw call; here the
chain from ``stream.synchronize()`` to the driver runs no bytecode.
"""

from collections import deque

__all__ = ["QueueStreamOps", "SVMStreamOps", "StreamCore"]


cdef class StreamCore:
    """``accelrt.Stream``'s backend object and its per-call methods, compiled. (Its other
    fields are ``Stream``'s own slots, which Python code reads faster than a compiled type's
    attributes.)"""

    cdef public object _ops
    cdef object __weakref__

    def query(self):
        """Return True if all work submitted to the stream has completed. Does not block."""
        return self._ops.query()

    def synchronize(self):
        """Block until all work submitted to the stream has completed."""
        ops = self._ops
        if isinstance(ops, QueueStreamOps):  # a C call (overrides in Python still win)
            (<QueueStreamOps>ops).synchronize()
        else:
            ops.synchronize()


cdef class QueueStreamOps:
    """The fields of a stream that is an in-order queue, and its ``synchronize``.

    ``queue`` has a blocking ``finish()`` (None once the stream was destroyed); ``last`` is
    the last command enqueued (None once finished); ``keep`` (a ``collections.deque``) holds
    what the queue's commands need alive, each entry appended after its command was
    enqueued. The subclass supplies ``missing()`` (raise the error of an unknown stream) and
    ``failed(call, exc)`` (raise the error for a driver exception, or return to re-raise it).
    """

    cdef public object queue, last, keep

    cpdef synchronize(self):
        """Block until the queue's work has completed; forget what that work needed.

        ``keep`` is swapped for an empty deque before ``finish``: every entry in the old one
        was appended, so enqueued, before it, and is forgotten without asking its command's
        status. What another thread enqueues meanwhile goes to the new one.
        """
        queue = self.queue
        if queue is None:
            self.missing()
        done = self.keep
        if done:
            self.keep = deque()
        try:
            queue.finish()
        except Exception as exc:
            if done:  # the work may still run: keep what it needs
                done.extend(self.keep)
                self.keep = done
            self.failed("stream_synchronize", exc)
            raise
        self.last = None


cdef class SVMStreamOps(QueueStreamOps):
    """A queue stream whose copies are ``clEnqueueSVMMemcpy`` calls through PyOpenCL, with its
    ``memcpy_async`` compiled: the base of OpenCL's ``_CLStream`` (backends/opencl.py, where
    its Python twin ``_SVMStreamFields`` holds the same method in Python).

    Fields, set by the subclass: ``views`` (a dict from (address, nbytes) to the ``cl.SVM`` of
    that device memory; a miss calls ``device_view(address, nbytes)``), ``wrap_host`` (makes
    the ``cl.SVM`` of a host memoryview), ``svm_memcpy`` (``(queue, is_blocking, dst, src,
    wait_for, nbytes)`` -> the copy's event), ``scan_at`` and ``scan_bytes`` (a copy of host
    memory calls ``rescan(keep)`` first once ``keep`` holds ``scan_at`` entries or
    ``unscanned`` bytes reach ``scan_bytes``), ``unscanned`` (bytes of host memory added to
    ``keep`` since the last rescan).
    """

    cdef public object views, wrap_host, svm_memcpy
    cdef public Py_ssize_t scan_at, scan_bytes, unscanned

    def memcpy_async(self, dst, src, Py_ssize_t nbytes):
        """``clEnqueueSVMMemcpy``, non-blocking; host memory is kept alive until it completes
        (in ``keep``, as ``(event, host memoryview)``; when it is trimmed: ``_CLStream.rescan``).
        """
        queue = self.queue
        if queue is None:
            self.missing()
        host = None
        try:
            if isinstance(dst, int):
                target = self.views.get((dst, nbytes))
                if target is None:
                    target = self.device_view(dst, nbytes)
            else:
                host = dst
                target = self.wrap_host(dst)
            if isinstance(src, int):
                source = self.views.get((src, nbytes))
                if source is None:
                    source = self.device_view(src, nbytes)
            else:
                # PyOpenCL wraps only writable memory: stage a read-only source (bytes)
                host = src if not src.readonly else memoryview(bytearray(src))
                source = self.wrap_host(host)
            event = self.svm_memcpy(queue, False, target, source, None, nbytes)
            self.last = event
            if host is not None:
                keep = self.keep  # read after the enqueue (see QueueStreamOps.synchronize)
                self.unscanned += host.nbytes
                if len(keep) >= self.scan_at or self.unscanned >= self.scan_bytes:
                    self.rescan(keep)
                keep.append((event, host))
        except Exception as exc:
            self.failed("memcpy_async", exc)
            raise
