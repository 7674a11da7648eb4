"""Helpers shared by several test modules: a test module imports them from here, never from another test module."""
