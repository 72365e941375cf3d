"""Wire protocol v1: msgspec tagged structs framed over an AF_UNIX stream."""
