"""AMQP 1.0 in pure Python (stdlib only, nothing else of ours): the data model every other part uses.

    types      typed values (ubyte, symbol, timestamp, Described, ...)
    message    the message model (`Message`, `Header`, `Properties`) and its JSON form
    encoding   the type system's encoding: single values to and from bytes
    sections   message sections: transfer bytes <-> `Message`, partial decoding, splicing

The encoding, re-exported here:

    decode_message(data, reads=None) -> Message      decode only the sections a filter reads
    set_message_annotation(data, key, value) -> bytes  splice one annotation, body bytes untouched
    redelivery_bytes(data, count) -> bytes            the header of a redelivery (first-acquirer false)
    encode_message(message) -> bytes
    decode(buf, pos) / encode(value) / skip(buf, pos)   single values
    CodecError                                          malformed bytes
"""

from .sections import ALL_SECTIONS, decode_message, encode_message, redelivery_bytes, scan, set_message_annotation
from .encoding import CodecError, decode, encode, skip

__all__ = [
    "ALL_SECTIONS",
    "CodecError",
    "decode",
    "decode_message",
    "encode",
    "encode_message",
    "redelivery_bytes",
    "scan",
    "set_message_annotation",
    "skip",
]
