"""Clients: HTTP (sync and async) and in-process, chosen by URL."""
