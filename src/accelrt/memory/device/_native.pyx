# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# distutils: language = c++
"""The compiled core of the caching allocator: its hit path in C++ (docs/design.md, "Two cores").

Python twins (change both; docs/design.md, "Pairs"): device/_hit_path.py (``HitPath``, method
for method), device/_block.py (``Block``, ``BlockPool``), device/_stats.py (``Stat``,
``StatArray``), memory/_policy.py (the ``K_*`` constants, ``round_size``, ``should_split``)
and replay.py (``_run_chunk``: ``run_events``).

This module holds the allocator's hot data and the operations that run on every call:
``Block`` and ``BlockPool`` (free blocks indexed by (stream, size, address) in C++ ordered
sets), ``Stat``/``StatArray`` (statistics as C integers), and ``HitPath``: ``malloc``,
``free``, the best-fit lookup, splitting and merging. The public fast path (``Buffer``:
buffers/_native.pyx; ``empty(n)``, ``copy_``: calls/_native.pyx) calls in here through the
functions _native.pxd declares.

``CachingAllocator`` (memory/device/_core.py) is ``HitPath`` in front of ``SlowPath``
(memory/device/_allocator.py), on this core and on the Python one alike: every rare path (new
segments, the OOM ladder, events, expandable segments, private pools, snapshots, history) is
``SlowPath``'s Python, working on these same objects through the same attribute names. The
methods here have the names of their Python twins (a ``def`` of each, for the Python paths
that call them; the hit path itself calls the ``cdef`` forms, ``malloc_c``, ``get_free_block``
...), and the differential test (tests/memory/test_native_core.py) holds the two to identical
blocks, addresses, statistics and snapshots.

Compiled code runs no bytecode, so a KeyboardInterrupt cannot arrive half-way through it: the
hit path is atomic by construction. Where it calls back into Python (the slow paths), those
functions are registered with memory/_atomic.py by memory/device/_core.py, as the Python hit
path is.
"""

from cpython.ref cimport Py_DECREF, Py_INCREF, Py_REFCNT, PyObject
from libc.stdint cimport INT64_MAX, INT64_MIN, int64_t
from libcpp.map cimport map as cmap
from libcpp.utility cimport pair
from libcpp.unordered_map cimport unordered_map
from libcpp.vector cimport vector

cimport cython
from cython.operator cimport dereference as deref, predecrement as dec
from fastrlock.rlock cimport create_fastrlock, lock_fastrlock, unlock_fastrlock

from ._requests import _not_allocated, _request_size
from ..._errors import OutOfMemoryError
from .._atomic import PENDING, deliver
from ._block import DEFAULT_POOL_ID, ExpandableSegment

__all__ = ["ActiveBlocks", "Block", "BlockPool", "HitPath", "Stat", "StatArray"]

cdef object _DEFAULT_POOL_ID = DEFAULT_POOL_ID
cdef int64_t K_MIN_BLOCK_SIZE = 512
cdef int64_t K_MAX_REQUEST_BYTES = 1 << 60
cdef int64_t K_SMALL_SIZE = 1 << 20
cdef int64_t K_SMALL_BUFFER = 2 << 20
cdef object UNLIMITED = 1 << 64

cdef enum:
    NUM_ROUNDUP_SLOTS = 16  # memory/_config.py NUM_ROUNDUP_SLOTS


cdef extern from *:
    int __builtin_clzll(unsigned long long) nogil

ctypedef PyObject* BlockRef  # a Block, borrowed or owned as the comment says


# ---------------------------------------------------------------------- statistics
@cython.final
cdef class Stat:
    """One statistic: current value, peak, and the sums of increases and decreases.

    The compiled twin of memory/device/_stats.py ``Stat``.
    """

    cdef public int64_t current, peak, allocated, freed

    cdef inline void up(self, int64_t amount) noexcept:
        self.current += amount
        self.allocated += amount
        if self.current > self.peak:
            self.peak = self.current

    cdef inline void down(self, int64_t amount) noexcept:
        self.current -= amount
        self.freed += amount

    def increase(self, int64_t amount):
        """Add ``amount`` to current (and to allocated); raise the peak if exceeded."""
        self.up(amount)

    def decrease(self, int64_t amount):
        """Subtract ``amount`` from current and add it to freed."""
        self.down(amount)

    def reset_peak(self):
        """Set peak to current."""
        self.peak = self.current

    def reset_accumulated(self):
        """Set allocated and freed to 0."""
        self.allocated = 0
        self.freed = 0


@cython.final
cdef class StatArray:
    """A ``Stat`` for all pools together and one each for the small and the large pool."""

    cdef public Stat all, small, large

    def __cinit__(self):
        self.all = Stat()
        self.small = Stat()
        self.large = Stat()

    cdef inline void up(self, bint is_small, int64_t amount) noexcept:
        self.all.up(amount)
        if is_small:  # no temporary reference, unlike a conditional expression
            self.small.up(amount)
        else:
            self.large.up(amount)

    cdef inline void down(self, bint is_small, int64_t amount) noexcept:
        self.all.down(amount)
        if is_small:  # no temporary reference, unlike a conditional expression
            self.small.down(amount)
        else:
            self.large.down(amount)

    def increase(self, bint is_small, int64_t amount):
        """Increase ``all`` and the given pool's stat."""
        self.up(is_small, amount)

    def decrease(self, bint is_small, int64_t amount):
        """Decrease ``all`` and the given pool's stat."""
        self.down(is_small, amount)

    def stats(self):
        """Return the stats in key order: ``all``, ``small_pool``, ``large_pool``."""
        return (self.all, self.small, self.large)


# ---------------------------------------------------------------------- blocks and pools
@cython.final
@cython.freelist(64)
@cython.trashcan(True)
cdef class Block:
    """A piece of a segment: allocated, pending free (waiting for events) or free.

    The compiled twin of memory/device/_block.py ``Block``: the same attributes and methods.
    """

    cdef public int64_t address, size, stream, requested_size, event_count, gc_count_base
    cdef public int64_t stamp
    cdef public bint allocated, mapped
    cdef public object stream_uses, frames
    cdef public BlockPool pool
    cdef public Block prev, next
    cdef object _segment
    cdef bint _expandable

    def __init__(self, int64_t address, int64_t size, int64_t stream, BlockPool pool, segment):
        self.address = address
        self.size = size
        self.stream = stream
        self.pool = pool
        self.segment = segment
        self.mapped = True

    @property
    def segment(self):
        return self._segment

    @segment.setter
    def segment(self, value):
        self._segment = value
        self._expandable = isinstance(value, ExpandableSegment)

    def is_split(self):
        """True if the block shares its segment with other blocks."""
        return self.prev is not None or self.next is not None

    def is_free(self):
        """True if the block is neither allocated nor waiting for events (it may be unmapped)."""
        return _is_free(self)

    def __repr__(self):
        state = "allocated" if self.allocated else "free" if self.mapped else "unmapped"
        return f"Block(address={self.address:#x}, size={self.size}, stream={self.stream}, {state})"


cdef inline bint _is_free(Block block):
    """``block.is_free()``, and the check itself for C callers (no Python call)."""
    return not block.allocated and block.event_count == 0 and not block.stream_uses


cdef inline Block _split_block(Block whole, int64_t size, Block spare):
    """A block for the first ``size`` bytes of ``whole`` (same stream, pool, segment): ``spare``
    (a merged-away block nothing else refers to, reset here) or a new one."""
    cdef Block block
    if spare is None:
        block = Block.__new__(Block)
    else:
        block = spare
        block.requested_size = 0
        block.gc_count_base = 0
        block.stream_uses = None
        block.frames = None  # not allocated, no events, unlinked: as _merge leaves it
    block.address = whole.address
    block.size = size
    block.stream = whole.stream
    block.pool = whole.pool
    block._segment = whole._segment
    block._expandable = whole._expandable
    block.mapped = True
    return block


cdef extern from *:
    """
    #include <algorithm>
    #include <vector>
    // One stream's free blocks, sorted by (size, address): a best fit is one binary search,
    // and inserting or removing moves the entries after it, with no allocation per block.
    struct FreeEntry { int64_t size; int64_t address; PyObject* block; };
    typedef std::vector<FreeEntry> FreeList;
    static inline size_t free_list_lower_bound(const FreeList& v, int64_t size, int64_t address) {
        return std::lower_bound(v.begin(), v.end(), FreeEntry{size, address, nullptr},
            [](const FreeEntry& a, const FreeEntry& b) {
                return a.size < b.size || (a.size == b.size && a.address < b.address);
            }) - v.begin();
    }
    static inline void free_list_insert(FreeList& v, int64_t size, int64_t address, PyObject* b) {
        v.insert(v.begin() + free_list_lower_bound(v, size, address), FreeEntry{size, address, b});
    }
    static inline PyObject* free_list_erase(FreeList& v, int64_t size, int64_t address) {
        size_t i = free_list_lower_bound(v, size, address);
        if (i == v.size() || v[i].size != size || v[i].address != address) return nullptr;
        PyObject* found = v[i].block;
        v.erase(v.begin() + i);
        return found;
    }
    """
    cdef struct FreeEntry:
        int64_t size
        int64_t address
        PyObject* block
    cdef cppclass FreeList:
        size_t size() noexcept
        FreeEntry& operator[](size_t) noexcept
        void clear() noexcept
    size_t free_list_lower_bound(const FreeList&, int64_t, int64_t) noexcept
    void free_list_insert(FreeList&, int64_t, int64_t, PyObject*) except +
    PyObject* free_list_erase(FreeList&, int64_t, int64_t) noexcept


@cython.final
cdef class BlockPool:
    """The free blocks of one pool by (stream, size, address), and its unmapped blocks.

    The compiled twin of memory/device/_block.py ``BlockPool``: the same methods, with each stream's
    free blocks in a sorted C++ vector. The pool holds a reference to each block it lists.
    """

    cdef cmap[int64_t, FreeList] _keys
    cdef size_t _count
    cdef cmap[int64_t, cmap[int64_t, BlockRef]] _unmapped_keys
    cdef vector[int64_t] _unmapped_order  # streams in first-seen order, as a dict keeps them
    cdef unordered_map[int64_t, BlockRef] _unmapped
    cdef public bint is_small
    cdef public object pool_id
    cdef public int64_t get_free_blocks_call_count

    def __init__(self, bint is_small, pool_id=DEFAULT_POOL_ID):
        self.is_small = is_small
        self.pool_id = pool_id

    def __dealloc__(self):
        self.drop_all()

    cdef void drop_all(self) noexcept:
        """Let go of every listed block (the allocator is gone)."""
        cdef size_t i
        for item in self._keys:
            for i in range(item.second.size()):
                Py_DECREF(<object>item.second[i].block)
        for unmapped in self._unmapped:
            Py_DECREF(<object>unmapped.second)
        self._keys.clear()
        self._count = 0
        self._unmapped.clear()
        self._unmapped_keys.clear()

    def __len__(self):
        return self._count

    cdef inline FreeList* stream_list(self, int64_t stream) noexcept:
        cdef cmap[int64_t, FreeList].iterator found = self._keys.find(stream)
        if found == self._keys.end():
            return NULL
        return &deref(found).second

    cdef inline int add(self, Block block) except -1:
        block.gc_count_base = self.get_free_blocks_call_count
        free_list_insert(self._keys[block.stream], block.size, block.address, <PyObject*>block)
        Py_INCREF(block)
        self._count += 1
        return 0

    cdef inline bint drop(self, Block block) noexcept:
        cdef FreeList* free_list = self.stream_list(block.stream)
        if free_list == NULL or free_list_erase(free_list[0], block.size, block.address) == NULL:
            return False
        self._count -= 1
        Py_DECREF(block)
        return True

    cdef inline Block first_fit(self, int64_t stream, int64_t size):
        cdef FreeList* free_list = self.stream_list(stream)
        if free_list == NULL:
            return None
        cdef size_t i = free_list_lower_bound(free_list[0], size, INT64_MIN)
        if i == free_list.size():
            return None
        return <Block>free_list[0][i].block

    cdef Block expandable_fit(self, int64_t stream, int64_t size, bint expandable):
        """memory/device/_hit_path.py ``_expandable_candidate``: the best fit when the first
        candidate is in an expandable segment (docs/allocator.md section 3); the stream has a
        block of at least ``size`` bytes."""
        cdef FreeList* free_list = self.stream_list(stream)
        cdef size_t i = free_list_lower_bound(free_list[0], size, INT64_MIN)
        cdef size_t n = free_list.size()
        cdef Block current = <Block>free_list[0][i].block
        cdef Block candidate
        if not expandable:  # switched off after some were made: skip their blocks
            for i in range(i + 1, n):
                candidate = <Block>free_list[0][i].block
                if not candidate._expandable:
                    return candidate
            return None
        for i in range(i + 1, n):
            if not current._expandable:
                break
            candidate = <Block>free_list[0][i].block
            if _growable_size(candidate) >= _growable_size(current):
                break
            current = candidate
        return current

    def insert(self, Block block not None):
        """Add a free mapped block; its garbage-collection age starts now."""
        self.add(block)

    def remove(self, Block block not None):
        """Remove a free mapped block."""
        if not self.drop(block):
            raise KeyError(block.address)

    def get(self, int64_t address):
        """Return the free block (mapped or not) starting at ``address``, if any.

        A scan of the free blocks: only snapshots and summaries ask, once per segment.
        """
        cdef size_t i
        for item in self._keys:
            for i in range(item.second.size()):
                if item.second[i].address == address:
                    return <Block>item.second[i].block
        cdef unordered_map[int64_t, BlockRef].iterator it = self._unmapped.find(address)
        if it != self._unmapped.end():
            return <Block>deref(it).second
        return None

    def lower_bound(self, int64_t stream, int64_t size):
        """Return the smallest block on ``stream`` with size >= ``size`` (lowest address first)."""
        return self.first_fit(stream, size)

    cdef list _listed(self, int64_t stream, int64_t size, bint below):
        cdef list out = []
        cdef FreeList* free_list = self.stream_list(stream)
        if free_list == NULL:
            return out
        cdef size_t bound = free_list_lower_bound(free_list[0], size, INT64_MIN)
        cdef size_t start = 0 if below else bound
        cdef size_t stop = bound if below else free_list.size()
        cdef size_t i
        for i in range(start, stop):
            out.append(<Block>free_list[0][i].block)
        return out

    def candidates(self, int64_t stream, int64_t size):
        """Iterate over the blocks on ``stream`` of size >= ``size``, by (size, address)."""
        return iter(self._listed(stream, size, False))

    def stream_blocks(self, int64_t stream, *, bint descending=False):
        """Return the blocks on ``stream`` by (size, address), or the reverse."""
        out = self._listed(stream, INT64_MIN, False)
        if descending:
            out.reverse()
        return out

    def stream_blocks_below(self, int64_t stream, int64_t size):
        """Return the blocks on ``stream`` smaller than ``size``, by (size, address)."""
        return self._listed(stream, size, True)

    def streams(self):
        """Return the streams that have free mapped blocks in this pool, in ascending order."""
        return [item.first for item in self._keys if item.second.size()]

    def blocks(self):
        """Iterate over a snapshot of all free mapped blocks in (stream, size, address) order."""
        cdef list out = []
        cdef size_t i
        for item in self._keys:
            for i in range(item.second.size()):
                out.append(<Block>item.second[i].block)
        return iter(out)

    def blocks_from(self, int64_t size):
        """Every free mapped block of at least ``size`` bytes, in (stream, size, address)
        order."""
        cdef list out = []
        cdef size_t i
        for item in self._keys:
            for i in range(free_list_lower_bound(item.second, size, INT64_MIN), item.second.size()):
                out.append(<Block>item.second[i].block)
        return out

    # unmapped blocks of expandable segments, by (stream, address)
    def insert_unmapped(self, Block block not None):
        """Add an unmapped block."""
        if self._unmapped_keys.count(block.stream) == 0:
            self._unmapped_order.push_back(block.stream)
        self._unmapped_keys[block.stream][block.address] = <PyObject*>block
        self._unmapped[block.address] = <PyObject*>block
        Py_INCREF(block)

    def remove_unmapped(self, Block block not None):
        """Remove an unmapped block."""
        if self._unmapped.count(block.address) == 0:
            raise KeyError(block.address)
        self.drop_unmapped(block)

    cdef inline void drop_unmapped(self, Block block) noexcept:
        self._unmapped_keys[block.stream].erase(block.address)
        self._unmapped.erase(block.address)
        Py_DECREF(block)

    def unmapped_blocks(self, int64_t stream):
        """Return the unmapped blocks on ``stream`` in address order."""
        cdef list out = []
        if self._unmapped_keys.count(stream):
            for item in self._unmapped_keys[stream]:
                out.append(<Block>item.second)
        return out

    def unmapped_at(self, int64_t stream, int64_t address):
        """Return the unmapped block on ``stream`` that holds ``address``, or None."""
        if not self._unmapped_keys.count(stream):
            return None
        cdef cmap[int64_t, BlockRef]* keys = &self._unmapped_keys[stream]
        cdef cmap[int64_t, BlockRef].iterator found = keys.upper_bound(address)
        if found == keys.begin():
            return None
        dec(found)
        cdef Block block = <Block>deref(found).second
        return block if address < block.address + block.size else None

    def first_run(self, int64_t stream, int64_t size, int64_t shared):
        """The first block of the lowest-address run of at least ``size`` bytes of unmapped
        blocks on ``shared`` and free mapped blocks of ``stream``: see
        memory/device/_block.py BlockPool.first_run."""
        if not self._unmapped_keys.count(shared):
            return None
        cdef cmap[int64_t, BlockRef]* keys = &self._unmapped_keys[shared]
        cdef int64_t walked_to = 0  # where the last failed walk stopped
        cdef int64_t room
        cdef Block start, before, walk
        for item in keys[0]:
            if item.first < walked_to:
                continue
            start = <Block>item.second
            before = start.prev
            if before is not None and before.mapped and before.stream == stream and _is_free(before):
                start = before
            room = 0
            walk = start
            while room < size and walk is not None and (not walk.mapped or walk.stream == stream):
                if not _is_free(walk):
                    break
                room += walk.size
                walk = walk.next
            if room >= size:
                return start
            walked_to = start.address + room
        return None

    def unmapped_streams(self):
        """Return the streams that have unmapped blocks in this pool."""
        return [s for s in self._unmapped_order if self._unmapped_keys[s].size()]

    def unmapped_count(self):
        """Return how many unmapped blocks the pool holds."""
        return self._unmapped.size()


cdef extern from *:
    """
    #include <cstdint>
    #include <unordered_map>
    #include <utility>
    #include <vector>
    // ActiveBlocks' table: a hash map of address -> block that keeps the nodes of the blocks
    // taken out (up to SPARE_NODES of them) and files the next blocks in them, so that allocs
    // and frees, which file and unfile one block each, allocate and release no node in runs
    // of either.
    struct accelrt_block_table {
        typedef std::unordered_map<int64_t, PyObject*> Map;
        static constexpr size_t SPARE_NODES = 256;
        Map map;
        std::vector<Map::node_type> spares;
        // File value at key; return the value it replaced there, or NULL.
        PyObject* put(int64_t key, PyObject* value) {
            if (!spares.empty()) {
                Map::node_type node = std::move(spares.back());
                spares.pop_back();
                node.key() = key;
                node.mapped() = value;
                auto placed = map.insert(std::move(node));
                if (placed.inserted) return NULL;
                spares.push_back(std::move(placed.node));  // the key was filed: still spare
                PyObject* old = placed.position->second;
                placed.position->second = value;
                return old;
            }
            auto placed = map.try_emplace(key, value);
            if (placed.second) return NULL;
            PyObject* old = placed.first->second;
            placed.first->second = value;
            return old;
        }
        PyObject* find(int64_t key) const {
            auto found = map.find(key);
            return found == map.end() ? NULL : found->second;
        }
        // Unfile key; return its value (the table's reference), or NULL.
        PyObject* take(int64_t key) {
            auto found = map.find(key);
            if (found == map.end()) return NULL;
            PyObject* value = found->second;
            Map::node_type node = map.extract(found);
            if (spares.size() < SPARE_NODES) spares.push_back(std::move(node));
            return value;
        }
    };
    """
    cdef cppclass BlockTable "accelrt_block_table":
        unordered_map[int64_t, BlockRef] map
        PyObject* put(int64_t, PyObject*) noexcept
        PyObject* find(int64_t) noexcept
        PyObject* take(int64_t) noexcept


@cython.final
cdef class ActiveBlocks:
    """Blocks by address, in a C++ hash map: the allocator's allocated and pending-free blocks,
    and a replay's live blocks by trace address.

    What the Python code uses as a dict of int to Block (the allocator's ``_active``, replay's
    live blocks): ``get``, ``pop``, ``update``, item assignment and deletion, ``values`` and
    ``len``. It holds a reference to each block. The map reuses the nodes of the blocks
    taken out (``BlockTable``), so mallocs and frees allocate no C++ node.
    """

    cdef BlockTable _table

    def __dealloc__(self):
        self.clear()

    cdef void clear(self) noexcept:
        for item in self._table.map:
            Py_DECREF(<object>item.second)
        self._table.map.clear()

    cdef inline int put(self, int64_t address, Block block) except -1:
        Py_INCREF(block)
        cdef PyObject* replaced = self._table.put(address, <PyObject*>block)
        if replaced != NULL:  # the address was filed: its old block is let go
            Py_DECREF(<object>replaced)
        return 0

    cdef inline PyObject* find(self, int64_t address) noexcept:
        return self._table.find(address)

    cdef inline PyObject* take(self, int64_t address) noexcept:
        """Unfile the block at ``address`` and return the map's reference to it (NULL if none)."""
        return self._table.take(address)

    cdef inline bint discard(self, int64_t address) noexcept:
        cdef PyObject* block = self.take(address)
        if block == NULL:
            return False
        Py_DECREF(<object>block)
        return True

    def get(self, int64_t address, default=None):
        """Return the block at ``address``, or ``default``."""
        cdef PyObject* block = self.find(address)
        return default if block == NULL else <Block>block

    def pop(self, int64_t address, *default):
        """Remove and return the block at ``address``; ``default`` if there is none (or
        KeyError if none was given), as ``dict.pop``."""
        cdef PyObject* taken = self.take(address)
        if taken == NULL:
            if default:
                return default[0]
            raise KeyError(address)
        block = <Block>taken
        Py_DECREF(block)  # the map's reference; ``block`` holds its own
        return block

    def update(self, pairs):
        """File each ``(address, block)`` of ``pairs``."""
        for address, block in pairs:
            self[address] = block

    def __setitem__(self, int64_t address, Block block not None):
        self.put(address, block)

    def __delitem__(self, int64_t address):
        if not self.discard(address):
            raise KeyError(address)

    def values(self):
        """Return the blocks (in no particular order)."""
        return [<Block>item.second for item in self._table.map]

    def __len__(self):
        return self._table.map.size()


# ---------------------------------------------------------------------- the hit path
cdef extern from "Python.h":
    long long PyLong_AsLongLongAndOverflow(object, int*) except? -1


cdef inline int64_t in_range(object nbytes) noexcept:
    """An exact ``int``'s value when it is a valid request (1 to K_MAX_REQUEST_BYTES), else
    0: compared in C, without making Python ints for the bounds."""
    cdef int overflow = 0
    cdef long long n = PyLong_AsLongLongAndOverflow(nbytes, &overflow)
    if overflow or not 0 < n <= K_MAX_REQUEST_BYTES:
        return 0
    return n


cdef int64_t _request_bytes(object nbytes) except -1:
    """A request's size in bytes: an in-range int at C speed, anything else through the
    allocators' one check (memory/device/_requests.py ``_request_size``), which raises."""
    cdef int64_t n = in_range(nbytes) if type(nbytes) is int else 0
    if n:
        return n
    return _request_size(nbytes, "device")



@cython.no_gc_clear
cdef class HitPath:
    """``malloc``, ``free`` and what they run on every call, compiled: device/_hit_path.py's
    ``HitPath``, the first base of ``CachingAllocator``.

    The attributes are those ``SlowPath`` sets, typed. Setting ``config``, ``stats`` or
    ``_max_split`` caches what the hit path reads from them.
    """

    _Block = Block
    _BlockPool = BlockPool
    _Stat = Stat
    _StatArray = StatArray
    _ActiveBlocks = ActiveBlocks

    cdef public object _lock  # a fastrlock.FastRLock: no Python call when uncontended
    cdef public BlockPool _small, _large
    cdef public ActiveBlocks _active
    cdef public dict _routes, _events
    cdef public list _finalized, _capture_deferred
    cdef public object _allowed_max, _observer
    cdef public bint _expandable
    cdef public int64_t _clock  # stamps free blocks as they enter a free list (section 16)
    cdef public int64_t _floor_page, _floor_peak  # policy:accelrt's page floor; 0: not kept
    cdef object _config, _stats
    cdef int64_t _max_split_c, _max_non_split_rounding
    cdef bint _rounds_to_divisions, _gc_configured
    cdef int64_t _divisions[NUM_ROUNDUP_SLOTS]
    cdef StatArray _allocation, _allocated_bytes, _active_count, _active_bytes
    cdef StatArray _requested_bytes, _inactive_split, _inactive_split_bytes
    cdef Stat _oversize_allocations
    cdef Block _spare  # a merged-away block to reuse (keep_spare)

    def __cinit__(self, *args, **kwargs):
        self._lock = create_fastrlock()
        self._max_split_c = INT64_MAX

    def __dealloc__(self):
        # Pools hold their blocks and blocks their pool: break the cycle the collector cannot
        # see (the pools' C++ sets are invisible to it).
        if self._small is not None:
            self._small.drop_all()
        if self._large is not None:
            self._large.drop_all()
        if self._active is not None:
            self._active.clear()

    def _make_lock(self):
        return self._lock

    @property
    def config(self):
        return self._config

    @config.setter
    def config(self, config):
        divisions = config.roundup_power2_divisions
        for i in range(NUM_ROUNDUP_SLOTS):
            self._divisions[i] = divisions[i]
        self._rounds_to_divisions = config.rounds_to_divisions
        self._max_non_split_rounding = config.max_non_split_rounding
        self._gc_configured = config.garbage_collection_threshold > 0
        self._config = config

    @property
    def stats(self):
        return self._stats

    @stats.setter
    def stats(self, stats):
        self._allocation = stats.allocation
        self._allocated_bytes = stats.allocated_bytes
        self._active_count = stats.active
        self._active_bytes = stats.active_bytes
        self._requested_bytes = stats.requested_bytes
        self._inactive_split = stats.inactive_split
        self._inactive_split_bytes = stats.inactive_split_bytes
        self._oversize_allocations = stats.oversize_allocations
        self._stats = stats

    @property
    def _max_split(self):
        return UNLIMITED if self._max_split_c == INT64_MAX else self._max_split_c

    @_max_split.setter
    def _max_split(self, value):
        self._max_split_c = INT64_MAX if value >= INT64_MAX else value

    cdef inline int64_t round_size(self, int64_t nbytes):
        """memory/_policy.py ``round_size`` with the cached configuration."""
        cdef int64_t divisions = 0, floor, step, rounded
        cdef int log_size, index
        if nbytes < K_MIN_BLOCK_SIZE:
            return K_MIN_BLOCK_SIZE
        if self._rounds_to_divisions:
            log_size = 63 - __builtin_clzll(<unsigned long long>nbytes)
            index = min(max(log_size - 20, 0), NUM_ROUNDUP_SLOTS - 1)
            divisions = self._divisions[index]
        if divisions > 1 and nbytes > K_MIN_BLOCK_SIZE * divisions:
            if nbytes & (nbytes - 1) == 0:
                return nbytes
            floor = (<int64_t>1) << (63 - __builtin_clzll(<unsigned long long>nbytes))
            step = floor // divisions
            if step == 0:
                return floor << 1
            rounded = nbytes & ~(step - 1)
            return nbytes if rounded == nbytes else rounded + step
        return (nbytes + K_MIN_BLOCK_SIZE - 1) // K_MIN_BLOCK_SIZE * K_MIN_BLOCK_SIZE

    def malloc(self, nbytes, stream):
        """Allocate a block of at least ``nbytes`` on ``stream``: see CachingAllocator.malloc."""
        return self.malloc_c(_request_bytes(nbytes), stream)

    cdef Block malloc_c(self, int64_t n, int64_t on_stream):
        cdef bint ran_python = False
        cdef int64_t size
        cdef BlockPool pool
        cdef Block block
        lock_fastrlock(self._lock, -1, True)
        try:
            if self._finalized:
                ran_python = True
                self._free_finalized()
            if self._events or self._capture_deferred:
                ran_python = True
                self._process_events()
            size = self.round_size(n)
            if self._routes:
                ran_python = True
                pool = self._routed_pool(size)
            else:
                pool = self._small if size <= K_SMALL_SIZE else self._large
            block = self.get_free_block(pool, size, on_stream)
            if block is None:
                ran_python = True
                block = self._malloc_slow(pool, size, n, on_stream)
            block = self.alloc_found_block(block, size, n)
            if self._observer is not None:
                ran_python = True
                self._observer.record("alloc", block.address, n, on_stream, block)
            return block
        finally:
            unlock_fastrlock(self._lock)
            if ran_python and PENDING.flag:
                deliver()

    def run_events(
        self,
        const signed char[:] codes,
        const int64_t[:] addresses,
        const int64_t[:] sizes,
        handles,
        int64_t handle,
        ActiveBlocks blocks not None,
        Py_ssize_t start,
        Py_ssize_t stop,
    ):
        """Replay events ``start`` to ``stop - 1`` of a trace's columns; the replay loop's core.

        Parameters
        ----------
        codes : int8 array
            Per event: 0 alloc, 1 free, 2 empty_cache, 3 skip, 4 too large for any device
            (accelrt/replay.py's work codes).
        addresses, sizes : int64 arrays
            The trace's addresses and byte counts.
        handles : int64 array or None
            Each event's stream handle; None when every event uses ``handle``.
        blocks : ActiveBlocks
            The live blocks by trace address (the allocator's ``_ActiveBlocks`` map); allocs
            add to it, frees take from it (a free of an address not in it is skipped).

        Returns
        -------
        int
            ``stop``, or the index of the first alloc that ran out of memory or is too large
            (code 4): the caller records it and goes on from the next event.

        Notes
        -----
        Same effect as calling ``malloc``/``free``/``empty_cache`` for each event, without a
        Python call per event: replay.py's Python loop (``_run_chunk``) is its reference.
        """
        cdef const int64_t[:] stream_of
        cdef bint per_event = handles is not None
        if per_event:
            stream_of = handles
        cdef Py_ssize_t i
        cdef signed char code
        cdef Block found
        cdef PyObject* taken
        for i in range(start, stop):
            code = codes[i]
            if code == 0:
                try:
                    block = self.malloc_c(sizes[i], stream_of[i] if per_event else handle)
                except OutOfMemoryError:
                    return i
                blocks.put(addresses[i], block)
            elif code == 1:
                taken = blocks.take(addresses[i])
                if taken != NULL:
                    found = <Block>taken
                    Py_DECREF(found)  # the map's reference; ``found`` holds its own
                    self.free_c(found)
            elif code == 2:
                self.empty_cache()
            elif code == 4:
                return i
        return stop

    cdef Block get_free_block(self, BlockPool pool, int64_t size, int64_t stream):
        if self._gc_configured and self._allowed_max is not None:
            pool.get_free_blocks_call_count += 1
        cdef Block block = pool.first_fit(stream, size)
        if block is None:
            return None
        if block._expandable:
            block = pool.expandable_fit(stream, size, self._expandable)
            if block is None:
                return None
        cdef int64_t max_split = self._max_split_c
        if size < max_split and block.size >= max_split:
            return None  # keep oversize blocks for oversize requests
        if size >= max_split and block.size >= size + self._max_non_split_rounding:
            return None
        pool.drop(block)
        return block

    cdef inline void note_floor(self, bint is_small, int64_t size) noexcept:
        """memory/_policy.py ``page_floor`` of the live bytes with ``size`` more, kept as a
        high-water mark in ``_floor_peak`` (policy:accelrt's budget, docs/allocator.md 16.1)."""
        cdef int64_t large = self._allocated_bytes.large.current
        cdef int64_t small = self._allocated_bytes.small.current
        cdef int64_t page = self._floor_page
        cdef int64_t floor
        if is_small:
            small += size
        else:
            large += size
        floor = (large + page - 1) // page * page
        floor += (small + K_SMALL_BUFFER - 1) // K_SMALL_BUFFER * K_SMALL_BUFFER
        if floor > self._floor_peak:
            self._floor_peak = floor

    cdef Block alloc_found_block(self, Block block, int64_t size, int64_t nbytes):
        cdef BlockPool pool = block.pool
        cdef bint is_small = pool.is_small
        if self._floor_page:
            self.note_floor(is_small, size)
        cdef bint counts_split = not block._expandable  # inactive_split skips expandable
        cdef bint already_split = block.prev is not None or block.next is not None
        cdef int64_t remaining_bytes = block.size - size
        cdef bint split
        cdef Block remaining
        if is_small or self._expandable:
            split = remaining_bytes >= K_MIN_BLOCK_SIZE
        else:
            split = size < self._max_split_c and remaining_bytes > K_SMALL_SIZE
        if split and pool.pool_id is not _DEFAULT_POOL_ID and self._pool_no_split(pool.pool_id):
            split = False  # a MemPool(no_split=True): blocks go out whole
        if split:
            remaining = block
            block = _split_block(remaining, size, self._spare)
            self._spare = None
            block.prev = remaining.prev
            if block.prev is not None:
                block.prev.next = block
            block.next = remaining
            remaining.prev = block
            remaining.address += size
            remaining.size -= size
            self._clock += 1
            remaining.stamp = self._clock
            pool.add(remaining)
            if counts_split and already_split:
                self._inactive_split_bytes.down(is_small, size)
            elif counts_split:
                self._inactive_split_bytes.up(is_small, remaining.size)
                self._inactive_split.up(is_small, 1)
        elif already_split and counts_split:
            self._inactive_split_bytes.down(is_small, block.size)
            self._inactive_split.down(is_small, 1)
        self.mark_allocated(block, is_small, nbytes)
        return block

    cdef inline int mark_allocated(self, Block block, bint is_small, int64_t nbytes) except -1:
        """Hand ``block`` out for a request of ``nbytes`` and count it in the statistics."""
        block.allocated = True
        block.requested_size = nbytes
        self._active.put(block.address, block)
        self._allocation.up(is_small, 1)
        self._allocated_bytes.up(is_small, block.size)
        self._active_count.up(is_small, 1)
        self._active_bytes.up(is_small, block.size)
        self._requested_bytes.up(is_small, nbytes)
        if block.size >= self._max_split_c:
            self._oversize_allocations.up(1)
        return 0

    def free(self, Block block not None):
        """Give a block back: see CachingAllocator.free."""
        self.free_c(block)

    cdef int free_c(self, Block block) except -1:
        cdef bint ran_python = False
        cdef bint is_small
        lock_fastrlock(self._lock, -1, True)
        try:
            if self._active.find(block.address) != <PyObject*>block or not block.allocated:
                raise _not_allocated(self.device_name, block.address)
            is_small = block.pool.is_small
            if self._observer is not None:
                ran_python = True
                self._observer.record(
                    "free_requested", block.address, block.requested_size, block.stream, block
                )
            block.allocated = False
            self._allocation.down(is_small, 1)
            self._allocated_bytes.down(is_small, block.size)
            if block.size >= self._max_split_c:
                self._oversize_allocations.down(1)
            if block.stream_uses:
                ran_python = True
                self._insert_events(block)
            else:
                ran_python = self.free_block(block) or ran_python
        finally:
            unlock_fastrlock(self._lock)
            if ran_python and PENDING.flag:
                deliver()
        return 0

    cdef int free_collected(self, Block block) except -1:
        """``free_soon`` for a buffer's finaliser: free now unless this thread is inside one
        of this allocator's operations (then SlowPath's ``free_soon`` defers it)."""
        if self._lock._is_owned():
            self.free_soon(block)
        else:
            self.free_c(block)
        return 0

    def _free_block(self, Block block not None):
        self.free_block(block)

    cdef bint free_block(self, Block block) except -1:
        """Return a block to its pool, merged with free neighbours; True if Python ran."""
        cdef BlockPool pool = block.pool
        cdef bint is_small = pool.is_small
        cdef int64_t original_size = block.size
        cdef int64_t requested = block.requested_size
        cdef int64_t split_blocks_change = 0
        cdef int64_t split_bytes_change = 0
        cdef int64_t subsumed
        cdef bint ran_python = False
        if self._observer is not None:
            ran_python = True
            self._observer.record("free_completed", block.address, requested, block.stream, block)
        self._active.discard(block.address)
        cdef Block neighbour = block.prev
        subsumed = _merge(block, neighbour, pool)
        if subsumed:
            split_blocks_change -= 1
            split_bytes_change -= subsumed
            self.keep_spare(neighbour)
        neighbour = block.next
        subsumed = _merge(block, neighbour, pool)
        if subsumed:
            split_blocks_change -= 1
            split_bytes_change -= subsumed
            self.keep_spare(neighbour)
        self._clock += 1
        block.stamp = self._clock
        pool.add(block)
        if not block._expandable:  # inactive_split skips expandable segments
            if block.prev is not None or block.next is not None:
                split_blocks_change += 1
                split_bytes_change += block.size
            if split_blocks_change > 0:
                self._inactive_split.up(is_small, split_blocks_change)
            elif split_blocks_change < 0:
                self._inactive_split.down(is_small, -split_blocks_change)
            if split_bytes_change > 0:
                self._inactive_split_bytes.up(is_small, split_bytes_change)
            elif split_bytes_change < 0:
                self._inactive_split_bytes.down(is_small, -split_bytes_change)
        self._active_count.down(is_small, 1)
        self._active_bytes.down(is_small, original_size)
        self._requested_bytes.down(is_small, requested)
        if pool.pool_id is not _DEFAULT_POOL_ID:
            ran_python = True
            self._release_dropped_pool_cache(pool.pool_id)
        return ran_python

    cdef inline void keep_spare(self, Block merged) noexcept:
        """Keep a merged-away block for the next split if nothing else refers to it (the
        caller's variable is its one reference): a split then makes no new object."""
        if Py_REFCNT(merged) == 1:
            self._spare = merged

    @staticmethod
    def _try_merge(Block dst not None, Block src, BlockPool pool not None):
        return _merge(dst, src, pool)

    # the Python names of the cdef methods above, for the Python paths that call them
    # (SlowPath, device/_arenas.py): the pair's one layout (device/_hit_path.py)
    def _get_free_block(self, BlockPool pool not None, int64_t size, int64_t stream):
        return self.get_free_block(pool, size, stream)

    def _note_floor(self, bint is_small, int64_t size):
        self.note_floor(is_small, size)

    def _alloc_found_block(self, Block block not None, int64_t size, int64_t nbytes):
        return self.alloc_found_block(block, size, nbytes)

    def _mark_allocated(self, Block block not None, int64_t nbytes):
        self.mark_allocated(block, block.pool.is_small, nbytes)


cdef inline int64_t _growable_size(Block block) noexcept:
    """memory/device/_hit_path.py ``_growable_size``: a free block's size plus the unmapped
    block after it."""
    cdef Block following = block.next
    if following is not None and not following.mapped:
        return block.size + following.size
    return block.size


cdef int64_t _merge(Block dst, Block src, BlockPool pool):
    """memory/device/_hit_path.py ``HitPath._try_merge``: the bytes absorbed, or 0.

    The absorbed ``src`` is unlinked from its old neighbours too, so that a discarded block
    someone still holds does not keep a chain of later blocks alive.
    """
    if (
        src is None
        or src.allocated
        or src.event_count > 0
        or src.stream_uses
        or src.mapped != dst.mapped
        or src.stream != dst.stream
    ):
        return 0
    cdef int64_t absorbed = src.size
    cdef Block held = src  # alive until it is unlinked below
    cdef Block beyond
    if src.mapped:
        pool.drop(src)
    else:
        pool.drop_unmapped(src)
    if dst.prev is src:
        dst.address = src.address
        beyond = src.prev
        dst.prev = beyond
        if beyond is not None:
            beyond.next = dst
    else:
        beyond = src.next
        dst.next = beyond
        if beyond is not None:
            beyond.prev = dst
    dst.size += absorbed
    held.prev = None
    held.next = None
    return absorbed


# ------------------------------- what buffers/ and calls/_native.pyx call (_native.pxd)
cdef object buffer_malloc(object allocator, object nbytes, int64_t stream, int64_t* address):
    """``allocator`` (a ``HitPath``)'s ``malloc`` of ``nbytes`` (an ``int``) on ``stream``: the
    block, its address in ``address``; None, allocating nothing, when ``nbytes`` is not a
    valid request (1 to ``K_MAX_REQUEST_BYTES``: the Python ``empty`` then decides)."""
    cdef int64_t n = in_range(nbytes)
    if not n:
        return None
    cdef Block block = (<HitPath>allocator).malloc_c(n, stream)
    address[0] = block.address
    return block


cdef int buffer_free(object allocator, object block) except -1:
    """``Buffer.free``'s call: the compiled ``free`` where ``allocator`` is a ``HitPath``, else
    its Python ``free``."""
    if isinstance(allocator, HitPath):
        (<HitPath>allocator).free_c(<Block?>block)
    else:
        allocator.free(block)
    return 0


cdef int buffer_free_collected(object allocator, object block) except -1:
    """The finaliser's call: ``HitPath.free_collected``, else the Python ``free_soon``."""
    if isinstance(allocator, HitPath):
        (<HitPath>allocator).free_collected(<Block?>block)
    else:
        allocator.free_soon(block)
    return 0


cdef bint is_hit_path(object allocator) noexcept:
    """Whether ``allocator`` is served by this compiled hit path."""
    return isinstance(allocator, HitPath)
