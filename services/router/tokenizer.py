"""Text to token ids, and the chat template.

The default tokenizer is byte-level (a prompt's UTF-8 bytes, ids 0-255): deterministic,
dependency-free, and it keeps prefix sharing (a shared text prefix is a shared id
prefix). A Hugging Face ``tokenizers`` JSON file (``KVC_TOKENIZER=path``) gives a real
model's ids without any model hub.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from kvcompass.errors import ConfigError

__all__ = ["ByteTokenizer", "ChatMessage", "HFTokenizer", "Tokenizer", "chat_prompt", "load"]


class Tokenizer(Protocol):
    name: str

    def encode(self, text: str) -> list[int]: ...


class ByteTokenizer:
    name = "bytes"

    def encode(self, text: str) -> list[int]:
        return list(text.encode())


class HFTokenizer:
    """A ``tokenizer.json`` of the Hugging Face ``tokenizers`` library."""

    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer as HFTokenizerFile  # only when configured

        try:
            self._tok = HFTokenizerFile.from_file(str(path))
        except Exception as exc:  # noqa: BLE001 - its errors are plain Exceptions
            raise ConfigError(f"cannot load tokenizer {path}: {exc}") from None
        self.name = path.name

    def encode(self, text: str) -> list[int]:
        # No special tokens: the chat template writes its own markers as text.
        return list(self._tok.encode(text, add_special_tokens=False).ids)


def load(spec: str) -> Tokenizer:
    """``"bytes"`` or the path of a tokenizers JSON file."""
    if spec == "bytes":
        return ByteTokenizer()
    path = Path(spec).expanduser()
    if not path.is_file():
        raise ConfigError(f"tokenizer {spec!r} is neither 'bytes' nor a file")
    return HFTokenizer(path)


ChatMessage = tuple[str, str]  # (role, content)


def chat_prompt(messages: Sequence[ChatMessage]) -> str:
    """The documented chat template: each message as ``<|role|>\\ncontent\\n``, then
    ``<|assistant|>\\n`` to open the reply. Earlier turns stay a byte-identical prefix
    of later ones, so a multi-turn session's prompts share their prefix."""
    return "".join(f"<|{role}|>\n{content}\n" for role, content in messages) + "<|assistant|>\n"
