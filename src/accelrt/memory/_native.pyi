# Types of the compiled core (memory/_native.pyx). Its Block, BlockPool, Stat and StatArray
# have exactly the attributes and methods of the Python classes, so they are typed as those.
from typing import Any

from ._block import Block as Block
from ._block import BlockPool as BlockPool
from ._stats import Stat as Stat
from ._stats import StatArray as StatArray

class RLock:
    def __enter__(self) -> bool: ...
    def __exit__(self, *exc_info: object) -> None: ...
    def _is_owned(self) -> bool: ...

class HotPath:
    def __init__(self, *args: Any, **kwargs: Any) -> None: ...
