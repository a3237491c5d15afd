"""AMQP 1.0 encoding in pure Python (no proton): typed values and message sections.

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
