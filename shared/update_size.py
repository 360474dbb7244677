"""How large an update of a known model can be, and which layout a model snapshot declares.

An update of a model with `n` parameters is `n` float32 values (or float16) plus fields whose
sizes the wire format bounds (ids of at most 128 characters, at most 32 metrics, a shape of at
most 8 dimensions: shared/wire.py). So a body larger than `max_update_bytes(n)` is not a valid
update of that model whatever it holds, and the ingest service refuses it unread (413) instead
of taking up to the wire's generic cap (64 MiB) from anyone who knows a client id.

The bound holds for any valid msgpack encoding of a valid update, not only ours: every string,
map, array and bin is allowed its largest header (5 bytes), every number its largest form
(9 bytes), every character 4 bytes of UTF-8. Clients written from docs/wire-format.md in other
languages (a Node.js client) may encode less compactly than msgpack-python; they still fit.
"""

from __future__ import annotations

import msgpack

from fedasync.shared.layout import Layout, LayoutError
from fedasync.shared.update import MAX_ID_LENGTH
from fedasync.shared.wire import DTYPES, MAX_DIMS, MAX_METRIC_NAME_LENGTH, MAX_METRICS

#: the largest header of a msgpack str, bin, array or map (a type byte and a 32-bit length)
_HEADER = 5
#: the largest msgpack int or float (a type byte and 8 bytes)
_NUMBER = 9
#: the update message's fields (top level, then weights'), by their longest name
_TOP_FIELDS = 8
_ARRAY_FIELDS = 3
_LONGEST_FIELD = len("base_version")
#: the fields that are numbers: schema, base_version, num_samples, created_at
_NUMBERS = 4
_LONGEST_DTYPE = max(len(name) for name in DTYPES)
_ITEM_BYTES = max(dtype.itemsize for dtype in DTYPES.values())


def _text(characters: int) -> int:
    return _HEADER + 4 * characters  # UTF-8: at most 4 bytes a character


def _fields(count: int) -> int:
    """A map of `count` fields' names (ASCII), its header included."""
    return _HEADER + count * (_HEADER + _LONGEST_FIELD)


#: everything in a valid update but its weights' data
UPDATE_OVERHEAD_BYTES = (
    _fields(_TOP_FIELDS)
    + _NUMBERS * _NUMBER
    + 2 * _text(MAX_ID_LENGTH)  # update_id, client_id
    + _fields(_ARRAY_FIELDS)  # weights: dtype, shape, data
    + _text(_LONGEST_DTYPE)
    + _HEADER
    + MAX_DIMS * _NUMBER
    + _HEADER  # the data's bin header
    + _HEADER
    + MAX_METRICS * (_text(MAX_METRIC_NAME_LENGTH) + _NUMBER)
)


def max_update_bytes(parameters: int) -> int:
    """The largest valid update message of a model of `parameters` float parameters, in bytes."""
    return UPDATE_OVERHEAD_BYTES + _ITEM_BYTES * parameters


def layout_in_head(head: bytes, *, whole: bool) -> Layout | None:
    """The layout a model snapshot message (shared/model_format.py) declares, read from its
    first bytes: the encoder writes `layout` before `weights`, so a reader need not fetch the
    weights to learn the model's size. None if `head` ends before the layout does (read more);
    LayoutError if it has none, or one that is not a layout. `whole`: `head` is the entire
    message (nothing more to read)."""
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=True)
    unpacker.feed(head)
    try:
        fields = unpacker.read_map_header()
        for _ in range(fields):
            if unpacker.unpack() == "layout":
                return Layout.from_list(unpacker.unpack())
            unpacker.skip()
    except msgpack.OutOfData:
        if whole:
            raise LayoutError("the model message ends before its layout") from None
        return None
    except (msgpack.UnpackException, ValueError, TypeError) as exc:
        raise LayoutError(f"not a model message: {exc}") from None
    raise LayoutError("the model message has no layout")
