"""The daemon: fill or restore, bind, serve, drain."""
