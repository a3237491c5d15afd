"""Errors of the filter core.  Each carries the AMQP condition the daemon sends when it refuses a link."""

from __future__ import annotations


class FilterError(ValueError):
    """A filter (selector, binding, filter-set) that cannot be applied.  Raised at compile time only."""

    condition = "amqp:invalid-field"

    def __init__(self, message: str, *, key: str | None = None):
        super().__init__(message)
        self.message = message
        self.key = key  # the filter-set key this error belongs to, when known

    def describe(self) -> str:
        """One line for an AMQP error description."""
        return f"filter {self.key!r}: {self.message}" if self.key is not None else self.message


class SelectorError(FilterError):
    """An invalid selector: `line` and `column` (1-based) point at the problem in `text`."""

    def __init__(self, message: str, text: str = "", position: int | None = None, *, key: str | None = None):
        self.text = text
        self.position = position  # 0-based offset into text, or None for "the whole selector"
        if position is not None:
            before = text[:position]
            self.line = before.count("\n") + 1
            self.column = position - (before.rfind("\n") + 1) + 1
        else:
            self.line = self.column = None
        where = f" at line {self.line}, column {self.column}" if self.line is not None else ""
        super().__init__(f"{message}{where}", key=key)
        self.problem = message

    def caret(self) -> str:
        """The offending line of the selector with a caret under the position."""
        if self.position is None:
            return self.text
        lines = self.text.split("\n")
        line = lines[self.line - 1] if self.line - 1 < len(lines) else ""
        return f"{line}\n{' ' * (self.column - 1)}^"


class LimitError(SelectorError):
    """A selector or filter-set over a configured limit (length, nesting depth, IN-list size)."""
