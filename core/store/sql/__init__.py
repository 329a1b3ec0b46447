"""The SQL stores' shared parts: one filter compiler and the dialects that spell it."""

from .compiler import check_filter, compile_filter
from .dialects import POSTGRES, SQLITE, Dialect, PostgresDialect, SQLiteDialect

__all__ = ["POSTGRES", "SQLITE", "Dialect", "PostgresDialect", "SQLiteDialect", "check_filter", "compile_filter"]
