"""Codecs: how an action's value becomes the bytes the store keeps, and back.

The bytes are the record's result exactly as the Rust crate stores it, so a value stored by
``JsonCodec`` here is replayed by ``idemkit_core::JsonCodec`` in Rust, and the other way round.
"""

from __future__ import annotations

import json
from typing import Any, Generic, Protocol, TypeVar

T = TypeVar("T")


class Codec(Protocol[T]):
    """Encodes a value to bytes and decodes it back; raise to refuse either way."""

    def encode(self, value: T) -> bytes: ...

    def decode(self, data: bytes) -> T: ...


# One encoder for every call: `json.dumps` with options builds a new one each time.
_JSON = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


class JsonCodec:
    """JSON values (dict, list, str, int, float, bool, None), compact UTF-8, as serde_json writes them."""

    __slots__ = ()

    def encode(self, value: Any) -> bytes:
        return _JSON.encode(value).encode()

    def decode(self, data: bytes) -> Any:
        return json.loads(data)

    def __repr__(self) -> str:
        return "JsonCodec()"


class BytesCodec:
    """Bytes stored as they are (a response body, a payload); ``bytearray`` and ``memoryview`` too."""

    __slots__ = ()

    def encode(self, value: bytes) -> bytes:
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise TypeError(f"BytesCodec encodes bytes, got {type(value).__name__}")
        return bytes(value)

    def decode(self, data: bytes) -> bytes:
        return data

    def __repr__(self) -> str:
        return "BytesCodec()"


class PydanticCodec(Generic[T]):
    """A pydantic model, as its JSON (``model_dump_json``); decoded with ``model_validate_json``."""

    __slots__ = ("model",)

    def __init__(self, model: type[T]) -> None:
        self.model = model

    def encode(self, value: T) -> bytes:
        if not isinstance(value, self.model):
            raise TypeError(f"PydanticCodec({self.model.__name__}) encodes {self.model.__name__}, got {type(value).__name__}")
        json: str = value.model_dump_json()  # type: ignore[attr-defined]
        return json.encode()

    def decode(self, data: bytes) -> T:
        value: T = self.model.model_validate_json(data)  # type: ignore[attr-defined]
        return value

    def __repr__(self) -> str:
        return f"PydanticCodec({self.model.__name__})"


JSON = JsonCodec()
BYTES = BytesCodec()
