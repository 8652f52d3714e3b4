"""hermes-video: ask questions about a video while it streams; the KV cache is the memory."""

__version__ = "0.1.0"
