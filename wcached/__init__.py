"""wcached: keeps inference model weights resident in device memory and hands
them to restarting engines as read-only mappings."""

__version__ = "0.1.0"
