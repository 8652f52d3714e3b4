"""The streaming engine: the cache, positions, compression and decoding behind a ``Session``."""
