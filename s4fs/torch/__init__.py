"""s4fs.torch — torch files stored without being written out as one byte stream.

``save`` (``s4fs.save`` / ``s4fs.async_save``) and ``load``
(``s4fs.load``, onto the GPU). Imports of the real ``torch`` in this package are
absolute: this package never shadows it. The zip records torch writes are described
once, in ``s4fs.parse.layout``, which the save fills in and the stream parser reads.
"""

from s4fs.parse.layout import Unsupported

__all__ = ["Unsupported"]
