"""Types of the compiled write call (write_call.pyx); the docstrings are there."""

__all__ = ["write_at"]

def write_at(
    target: tuple[int, int, int, int, int, int],
    keys: int,
    clear: int,
    bits: int,
    n: int,
    start: int,
) -> tuple[int, int]: ...
