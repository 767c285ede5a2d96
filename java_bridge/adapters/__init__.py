"""The Java interfaces of ``smile.llm`` implemented over ``smile_llm`` objects (JPype proxies).

Every method goes through ``errors.bridged`` (Python errors arrive as Java exceptions with the
Python message). Arguments: Java ``int[]``/``long[]`` arrive as JPype arrays and are read with one
copy (``np.array``); K/V cross as direct ``ByteBuffer``s in native byte order, viewed with
``torch.frombuffer`` from their ``position()`` without a copy. Returns are checked ints (in the Java
type's range) or numpy arrays of the declared Java type (JPype would silently truncate a float
returned as a long). Listener callbacks into Java run while no Python lock is held (``generate``
calls them between steps).

Modules: ``convert`` (Java arrays, checked returns, ByteBuffer views, Smile's value types), ``pool``
(``KvCachePool.Backend``), ``pool_graphs`` (its CUDA-graph calls), ``csr`` (its FlashInfer CSRs and
index buffers as Java values), ``radix`` (``RadixCache``, standalone or a pool's), ``model``
(``LanguageModel``), ``requests`` (Java arguments to a request, futures and their delivery,
completions back), ``sampling`` (``smile.llm.SamplingParams`` to Python's, Java field names in error
messages), ``segments`` (``smile.llm.python.Segment`` and ``segments`` pieces), ``chat``
(``Message`` lists and template variables to Python values), ``engine``
(``smile.llm.engine.InferenceEngine``), ``factory`` (``Bridge.Factory``, ``pinCurrentThread``).
"""

from .factory import FactoryAdapter, PinThread
from .model import LanguageModelAdapter
from .pool import KvCachePoolAdapter, RadixCacheAdapter

__all__ = ["FactoryAdapter", "KvCachePoolAdapter", "LanguageModelAdapter", "PinThread",
           "RadixCacheAdapter"]
