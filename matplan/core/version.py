"""matplan's version, kept in core so that any layer can name it without importing the package root."""
__version__ = "0.1.0"
