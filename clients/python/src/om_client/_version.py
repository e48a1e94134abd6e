"""The distribution's version (hatchling reads it from here for the package metadata)."""

__version__ = '0.1.0'
