# Types of the compiled core (memory/device/_native.pyx). Its Block, BlockPool, Stat, StatArray
# and HitPath have exactly the attributes and methods of the Python classes, so they are typed
# as those.
from ._block import Block as Block
from ._block import BlockPool as BlockPool
from ._hit_path import HitPath as HitPath
from ._stats import Stat as Stat
from ._stats import StatArray as StatArray

class ActiveBlocks(dict[int, Block]): ...
