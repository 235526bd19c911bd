"""The read path: from a descriptor's read to the bytes of a committed version.

* ``node``: :class:`FileNode` (one file across its versions: what every descriptor of
  it reads, what the kernel may keep cached) and :class:`NodeReader` (one descriptor);
* ``reader``: :class:`FileReader` (byte ranges of a version, its chunks from an
  :class:`s4fs.chunks.ChunkSource`) and :class:`ReadHandle` (one view: a spool, a
  decoded copy or a ``FileReader``);
* ``fill``: decoding a cold version ahead into the decoded cache (:class:`Fills`: which
  versions, by which pool, in batches of what size); ``fetch``: a remote store's bytes
  of those batches brought ahead of their decode, many GETs in flight;
* ``packs``: :class:`PackCache`, local copies of the newest packs;
* ``decoded``: :class:`DecodedCache`, whole committed files on local disk.

It never imports the write room or the filesystem: a node's writer and views come in
through its callers.
"""

from s4fs.read.decoded import DecodedCache
from s4fs.read.fill import Fills
from s4fs.read.node import FileNode, NodeReader
from s4fs.read.packs import PackCache
from s4fs.read.reader import FileReader, ReadHandle

__all__ = ["DecodedCache", "FileNode", "FileReader", "Fills", "NodeReader",
           "PackCache", "ReadHandle"]
